"""Scheduler actor: moves messages between requesters, a policy and the instance workers.

The policy (pure, see ``nursery/scheduling``) decides; this actor only does what it says:
it feeds arrivals and ``InstanceReady`` notices to the policy, sends ``ExecuteBatch`` to the
chosen instance, answers rejections, and sleeps until its next message or the policy's next
deadline. Requests whose requester has stopped waiting are dropped before they reach an
instance. On ``CloseIntake`` it finishes the queue, then closes the instances' inboxes,
which ends them; when every sender of its own inbox is gone, it returns.

The same actor runs the default (FIFO) policy today and the batching policies later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from nursery.errors import NurseryError, Unavailable
from nursery.messages import CloseIntake, ExecuteBatch, InferWork, InstanceReady
from nursery.scheduling.decisions import Dispatch, Reject, SchedulingPolicy

log = logging.getLogger("nursery.scheduler")

RejectError = Callable[[str], NurseryError]


async def run(
    *,
    name: str,
    policy: SchedulingPolicy[InferWork],
    inbox: trio.MemoryReceiveChannel[Any],
    instances: Sequence[trio.MemorySendChannel[ExecuteBatch]],
    reject_error: RejectError = Unavailable,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    closing = False
    outstanding = [0] * len(instances)  # batches sent to each instance and not finished
    task_status.started()
    async with inbox:
        try:
            while True:
                now = trio.current_time()
                poll = policy.poll(now)
                dropped = False
                for decision in poll.decisions:
                    if isinstance(decision, Dispatch):
                        live = tuple(w for w in decision.items if not w.abandoned())
                        if not live:  # nobody waits for these: the place stays free
                            policy.instance_ready(decision.instance, now)
                            dropped = True
                            continue
                        instances[decision.instance].send_nowait(ExecuteBatch(live))
                        outstanding[decision.instance] += 1
                    elif isinstance(decision, Reject):
                        for w in decision.items:
                            _answer(w, reject_error(decision.reason))
                if dropped:
                    continue  # the freed place may take the next request at once
                if closing and instances and policy.pending() == 0 and not any(outstanding):
                    for channel in instances:
                        await channel.aclose()  # ends the workers, which close their senders
                    instances = ()
                try:
                    if poll.wake_at is None:
                        message = await inbox.receive()
                    else:
                        message = None
                        with trio.move_on_at(poll.wake_at):
                            message = await inbox.receive()
                        if message is None:
                            continue  # the policy's deadline: poll again
                except trio.EndOfChannel:
                    return
                now = trio.current_time()
                while True:  # take everything already waiting before deciding again
                    if isinstance(message, InferWork):
                        if closing or not instances:
                            _answer(message, Unavailable(f"model '{name}' is unloading"))
                        else:
                            policy.arrive(message, now)
                    elif isinstance(message, InstanceReady):
                        i = message.instance
                        outstanding[i] = max(0, outstanding[i] - message.slots)
                        policy.instance_ready(i, now, message.slots)
                    elif isinstance(message, CloseIntake):
                        closing = True
                    try:
                        message = inbox.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
        finally:
            with trio.CancelScope(shield=True):
                for channel in instances:
                    await channel.aclose()


def _answer(work: InferWork, answer: NurseryError) -> None:
    try:
        work.reply.send_nowait(answer)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
