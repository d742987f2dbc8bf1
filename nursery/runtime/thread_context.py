"""What the calling thread works for: the context its owner gave it (how code on an instance's
thread reaches the services its instance was given) and the trio token of the run that owns it.

A :class:`~nursery.runtime.threads.DedicatedThread` binds both for its thread; a Python stub
process, which serves one instance and has no trio run, binds its context here. Apart from
``threads.py`` so that a stub process reads and binds contexts without importing trio (its
start is that much shorter).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import trio

local = threading.local()  # per thread: ``token`` and ``context``, where bound
_process_context: Any = None  # every thread's context in a process serving one instance


def current_token() -> trio.lowlevel.TrioToken:
    """The trio token of the run that owns the calling thread (a :class:`DedicatedThread`
    or the trio thread itself), for code that must call back into trio."""
    token: trio.lowlevel.TrioToken | None = getattr(local, "token", None)
    if token is None:
        # the trio thread's own: trio is imported here, where it is running already, so that
        # a stub process (which never asks) does not load it
        import trio

        token = trio.lowlevel.current_trio_token()  # RuntimeError outside trio
    return token


def current_context() -> Any:
    """What the owner of the calling :class:`DedicatedThread` gave it as ``context`` (None on
    any other thread): how code running on an instance's thread reaches the services its
    instance was given (a Python model's BLS calls reach the model client so); in a process
    that serves one instance (:func:`bind_process_context`), that instance's on any thread."""
    return getattr(local, "context", _process_context)


def bind_process_context(context: Any) -> None:
    """The context of every thread of this process that was given none: for a stub process,
    which serves one model instance, so that threads the model starts itself reach the
    server too (Triton lets a model call other models from any thread it starts)."""
    global _process_context
    _process_context = context


def bind_context(context: Any) -> None:
    """Give the calling thread a context (what :func:`current_context` returns on it): for a
    thread nursery does not own as a :class:`DedicatedThread`, e.g. a stub process's main
    thread."""
    local.context = context
