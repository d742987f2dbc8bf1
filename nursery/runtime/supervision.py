"""Supervision boundaries: an unexpected failure costs its own unit, never the process.

Structured concurrency sends every exception that nobody catches up to the root nursery, which
ends the server. A *boundary* stops it at the unit it belongs to (one request, one connection,
one actor command, one model version): the unit gets its error answer, the failure is logged
once (the traceback only at debug level) and counted by unit in a :class:`FaultCounter`, which
the metrics port exposes as ``nursery_internal_errors_total{unit=...}``.

trio wraps what a nursery raises in an ``ExceptionGroup``, so a boundary splits groups: the
``Exception`` leaves are the failure it handles, anything else (``trio.Cancelled``,
``KeyboardInterrupt``) goes on up untouched, since cancellation is how trio stops work.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import TracebackType

import trio

GONE = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)
"""What a peer (client, requester, actor) going away looks like: not a fault of ours."""


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside ``exc``, exception groups flattened."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def only_gone(exc: BaseException, gone: tuple[type[BaseException], ...] = GONE) -> bool:
    """True when ``exc`` (a group included) says only that a peer went away."""
    return all(isinstance(e, gone) for e in leaves(exc))


def split_unexpected(exc: BaseException) -> tuple[Exception | None, BaseException | None]:
    """``exc`` split in two: the part a boundary handles (every ``Exception``, to answer and
    count) and the part that must go on up (``trio.Cancelled``, ``KeyboardInterrupt``: any
    ``BaseException`` that is not an ``Exception``, wherever it sits in a group)."""
    if isinstance(exc, BaseExceptionGroup):
        unexpected, rest = exc.split(Exception)
        return unexpected, rest
    if isinstance(exc, Exception):
        return exc, None
    return None, exc


def describe(exc: BaseException, limit: int = 200) -> str:
    """A short one-line account of an exception, ``ValueError: bad value``; a group's first
    four leaves."""
    if isinstance(exc, BaseExceptionGroup):
        parts = [describe(e, limit) for e in exc.exceptions[:4]]
        more = len(exc.exceptions) - 4
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    try:
        text = str(exc).replace("\n", " ")
    except Exception:  # a broken __str__ must not break the boundary that reports it
        text = "(no message)"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FaultCounter:
    """How many unexpected failures each kind of unit's boundary caught since start."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def record(self, unit: str, exc: BaseException, log: logging.Logger, what: str) -> str:
        """Count and log one failure of ``what`` (a unit of kind ``unit``); returns the short
        description that the unit's error answer may carry."""
        self.count(unit)
        text = describe(exc)
        log.error("internal error in %s: %s", what, text)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("traceback of the internal error in %s", what, exc_info=exc)
        return text

    def count(self, unit: str) -> None:
        """One failure of a ``unit`` that its boundary has logged itself."""
        self._counts[unit] = self._counts.get(unit, 0) + 1

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)


class Boundary:
    """``with Boundary(faults, unit, log, what) as b:`` runs a unit of work; an ``Exception``
    (or the ``Exception`` leaves of a group) escaping it is recorded and swallowed, and
    ``b.failure`` holds its short description for the unit's error answer. Cancellation and
    other ``BaseException``\\ s pass through untouched."""

    __slots__ = ("faults", "unit", "log", "what", "failure")

    def __init__(self, faults: FaultCounter, unit: str, log: logging.Logger, what: str) -> None:
        self.faults = faults
        self.unit = unit
        self.log = log
        self.what = what
        self.failure: str | None = None

    def __enter__(self) -> Boundary:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None:
            return False
        unexpected, rest = split_unexpected(exc)
        if unexpected is not None:
            self.failure = self.faults.record(self.unit, unexpected, self.log, self.what)
        if rest is None:
            return True
        if rest is exc:
            return False
        raise rest


__all__ = ["GONE", "Boundary", "FaultCounter", "describe", "leaves", "only_gone", "split_unexpected"]
