"""Wake trio's run loop at a deadline to the microsecond, not the next millisecond.

trio sleeps in ``epoll.poll(timeout)``, and Python hands epoll the timeout in whole
milliseconds, rounded up: a ``move_on_at`` 500 µs away returns after 1 ms or more. The dynamic
batcher's ``max_queue_delay_microseconds`` is often below a millisecond (Triton honours it to
the microsecond), so its scheduler would hold every batch about 0.5-1 ms too long.

:class:`PreciseWake` arms a Linux ``timerfd`` (nanosecond resolution) for the deadline, and a
task of the actor waits for it to become readable: epoll then returns on time and trio, which
checks its deadlines after every wake-up, fires the ``move_on_at``. Elsewhere (not Linux, no
libc ``timerfd_create``, or a test's virtual clock, where deadlines are not real time)
:func:`create` returns ``None`` and the actor keeps trio's own timing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys
import time
from functools import cache

import trio

log = logging.getLogger("nursery.timer")

_CLOCK_MONOTONIC = 1  # what time.perf_counter() reads on Linux, and so trio's SystemClock
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
# fire a little after the deadline: an early wake-up finds the deadline not yet passed and
# trio would sleep a whole (rounded-up) millisecond more
_MARGIN_S = 5e-6


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


@cache
def _load_libc() -> ctypes.CDLL | None:
    """The C library with timerfd's signatures (Linux only; loaded once per process)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


class PreciseWake:
    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc, self._fd = libc, fd
        self._spec = _Itimerspec()
        self._armed = float("nan")

    def arm(self, deadline: float) -> None:
        """Make epoll return at ``deadline`` (trio time), whatever else is pending."""
        if deadline == self._armed:
            return
        self._armed = deadline
        at = deadline - trio.current_time() + time.perf_counter() + _MARGIN_S
        sec = int(at)
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = sec, int((at - sec) * 1e9)
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec),
                                      None) != 0:
            log.debug("timerfd_settime failed: %s", os.strerror(ctypes.get_errno()))

    async def serve(self) -> None:
        """Wait for the timer, forever (cancel it to stop): its firing is the wake-up."""
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                os.read(self._fd, 8)
            except OSError as exc:  # re-armed to a later time between firing and reading
                if exc.errno != errno.EAGAIN:
                    raise

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._fd)
        os.close(self._fd)


def create() -> PreciseWake | None:
    """A timer for the calling trio run, or ``None`` where trio's own timing must do."""
    if type(trio.lowlevel.current_clock()).__name__ != "SystemClock":
        return None  # a virtual clock (tests): its deadlines are not CLOCK_MONOTONIC times
    libc = _load_libc()
    if libc is None:
        return None
    fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
    if fd < 0:
        log.debug("timerfd_create failed: %s", os.strerror(ctypes.get_errno()))
        return None
    return PreciseWake(libc, fd)
