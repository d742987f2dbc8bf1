"""Targets that misbehave on purpose, for ``test_fuzz_runner``: the campaign runner must
record each misbehaviour, save its input, and carry on with the next target."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from nursery.errors import InvalidArgument


def documented(data: bytes) -> None:
    if data[:1] != b"{":
        raise InvalidArgument("not JSON")  # a documented error: not a bug


def raises(data: bytes) -> None:
    if len(data) > 3:
        int(data.decode("latin-1"))  # an undocumented ValueError: a bug


_hung = False


def hangs(data: bytes) -> None:
    global _hung
    if len(data) > 3 and not _hung:  # once: the alarm costs its whole period each time
        _hung = True
        while True:  # Python code: the per-input alarm interrupts it
            time.sleep(0.01)


def stuck(data: bytes) -> None:
    if len(data) > 3:  # as a hang inside C code: no alarm reaches it; the parent kills it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            time.sleep(0.01)


def dies(data: bytes) -> None:
    if len(data) > 3:
        os.kill(os.getpid(), 9)  # the child is gone: the parent records it


TARGETS: dict[str, Callable[[bytes], None]] = {
    "documented": documented, "raises": raises, "hangs": hangs, "stuck": stuck,
    "dies": dies,
}
SEEDS = {name: [b"{ab"] for name in TARGETS}
