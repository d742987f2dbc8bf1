"""RateLimiter: one server-wide actor owning the rate limiter's resource pools
(``--rate-limit execution_count``).

Instance workers that list resources register when they start (a request for more copies
than exist fails the load), ask for a grant before each batch and release after it. The
decisions are ``RateLimitPolicy``'s (pure); the actor only moves messages. A grant whose
requester stopped waiting is given back at once, so nothing leaks.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.errors import ConfigError, NurseryError
from nursery.messages import (
    AcquireResources,
    RegisterInstance,
    ReleaseResources,
    UnregisterInstance,
)
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.rate_limit_policy import (
    RateLimitError,
    RateLimitPolicy,
    describe_max_resources,
)

log = logging.getLogger("nursery.ratelimit")


async def run(
    *,
    policy: RateLimitPolicy,
    inbox: trio.MemoryReceiveChannel[Any],
    faults: FaultCounter | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    faults = faults or FaultCounter()
    waiting: dict[Hashable, trio.MemorySendChannel[Any]] = {}
    pools = policy.max_resources()
    task_status.started()
    def handle(message: Any) -> None:
        nonlocal pools
        try:
            if isinstance(message, AcquireResources):
                if message.key not in policy.instances:
                    mailbox.answer(message.reply, True)  # not registered: nothing to limit
                    return
                waiting[message.key] = message.reply
                policy.request(message.key)
            elif isinstance(message, ReleaseResources):
                policy.release(message.key)
            elif isinstance(message, RegisterInstance):
                try:
                    policy.register(message.key, message.device, message.needs,
                                    message.priority)
                except RateLimitError as exc:
                    mailbox.answer(message.reply, ConfigError(str(exc)))
                    return
                mailbox.answer(message.reply, None)
            elif isinstance(message, UnregisterInstance):
                policy.unregister(message.key)
                waiting.pop(message.key, None)
            if isinstance(message, (RegisterInstance, UnregisterInstance)):
                now = policy.max_resources()
                if now != pools:  # the pools follow the instances registered
                    pools = now
                    log.debug("%s", describe_max_resources(pools))
        except Exception as exc:  # one command is the unit of failure
            faults.record("ratelimiter", exc, log, "rate limiter command")
            reply = getattr(message, "reply", None)
            if reply is not None:  # never leave a worker waiting: it runs unlimited
                mailbox.answer(reply, None if isinstance(message, RegisterInstance) else True)

    async with inbox:
        async for message in inbox:
            handle(message)
            while True:  # everything already sent before deciding: requests that came at
                try:     # once are weighed together (by pass, then priority), not by arrival
                    handle(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            while True:  # a grant nobody waits for is released at once, which may grant more
                lost = False
                for key in policy.grants():
                    log.debug("rate limiter: %s may run", key)
                    reply = waiting.pop(key, None)
                    if reply is None or not mailbox.answer(reply, True):
                        policy.release(key)
                        lost = True
                if not lost:
                    break


class RateLimiterClient:
    """What an instance worker holds: its key and the limiter's inbox."""

    def __init__(self, inbox: trio.MemorySendChannel[Any]) -> None:
        self.inbox = inbox

    async def register(self, key: Hashable, device: int, needs: tuple[Any, ...],
                       priority: int) -> None:
        error: NurseryError | None = await mailbox.ask(
            self.inbox, lambda reply: RegisterInstance(key, device, needs, priority, reply),
            gone="the rate limiter has stopped")
        if error is not None:
            raise error

    def unregister(self, key: Hashable) -> None:
        mailbox.tell(self.inbox, UnregisterInstance(key))

    async def acquire(self, key: Hashable) -> None:
        # cancelled while waiting: the closed reply channel gives the grant back
        await mailbox.ask(self.inbox, lambda reply: AcquireResources(key, reply),
                          gone="the rate limiter has stopped")

    def request(self, key: Hashable, reply: Any) -> bool:
        """Ask for a grant without waiting: the answer goes to ``reply`` (a reply channel's
        send end, or an object with its interface); False when the limiter has stopped."""
        return mailbox.tell(self.inbox, AcquireResources(key, reply))

    def release(self, key: Hashable) -> None:
        mailbox.tell(self.inbox, ReleaseResources(key))
