"""Serving one model version: its own nursery holding its instance workers and its scheduler
(or, for an ensemble, its EnsembleScheduler). The ModelManager starts one of these per version
inside its supervision boundary, and stops it by closing its intake (drain) or cancelling it."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from nursery.actors import ensemble, instance_worker, mailbox, scheduler
from nursery.actors.directory import ModelHandle
from nursery.actors.model_client import ModelClient
from nursery.backends.base import BackendFactory
from nursery.config.model import ModelConfig
from nursery.config.warmup import WarmupSample
from nursery.messages import InferWork, UpdateInstances
from nursery.runtime.devices import InstancePlacement
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling import start_delay
from nursery.scheduling.selection import PolicyChoice, policy_for

log = logging.getLogger("nursery.manager")

# what a started version hands its manager: the handle the directory publishes, the
# scheduler's control channel, and how to change its instances in place (None: an ensemble)
Resize = Callable[[ModelConfig], Awaitable[ModelHandle]]
Started = trio.TaskStatus[tuple[ModelHandle, trio.MemorySendChannel[Any], Resize | None]]


@dataclass(eq=False)
class _Instance:
    """A running instance worker of the version: what a resize matches and waits for."""

    signature: bytes  # Triton's instance signature (config.instance_signatures)
    intake: instance_worker.WorkerIntake
    ended: trio.Event


async def _worker(run: Any, ended: trio.Event,
                  task_status: trio.TaskStatus[instance_worker.WorkerIntake]) -> None:
    try:
        await run(task_status=task_status)
    finally:
        ended.set()


async def serve_version(
    *,
    config: ModelConfig,
    version: int,
    version_path: Path,
    factory: BackendFactory,
    warmup: tuple[WarmupSample, ...],
    client: ModelClient,
    rate_limiter: Any,
    summaries: bool,
    scope: trio.CancelScope,
    done: trio.Event,
    task_status: Started,
) -> None:
    """Start every instance worker (each loads its backend on its own thread), then the
    scheduler; then report the version's handle, the scheduler's control channel and the
    version's resize (a reload that changed only the instance groups, Triton's
    UpdateInstanceGroup: instances whose signature is unchanged are kept, the others are
    added or retired)."""
    placements = config.placements()
    # Unbounded: internal notices (InstanceReady, CloseIntake) must always get in. The
    # scheduler takes every message at once; its policy bounds the queue it keeps.
    intake, inbox = trio.open_memory_channel[Any](math.inf)
    delay = (start_delay.from_environment(os.environ, config.name)
             if config.sequence is not None or config.batching is not None else None)
    choice: PolicyChoice[InferWork] = policy_for(config, len(placements),
                                                 describe=lambda work: work.request,
                                                 signature=lambda work: work.signature,
                                                 start_delay=delay)
    live: dict[int, _Instance] = {}  # the instances of the current configuration, by index
    next_index = len(placements)
    # rate-limited instances under the dynamic batcher or the default scheduler: the
    # scheduler holds their grants, so a batch is formed when it may run
    granted = rate_limiter is not None and hasattr(choice.policy, "withdraw_ready")
    try:
        with scope:
            async with trio.open_nursery() as version_nursery:

                async def start(serving: ModelConfig, placement: InstancePlacement,
                                signature: bytes, into: dict[int, _Instance]) -> None:
                    ended = trio.Event()
                    run = partial(
                        instance_worker.run,
                        config=serving,
                        version=str(version),
                        version_path=version_path,
                        placement=placement,
                        factory=factory,
                        scheduler=intake.clone(),
                        slots=choice.slots,
                        warmup=warmup,
                        rate_limiter=rate_limiter,
                        client=client,
                        granted=granted,
                    )
                    worker = await version_nursery.start(_worker, run, ended)
                    into[placement.index] = _Instance(signature, worker, ended)

                # each worker hands back its intake once its instance is loaded: the
                # scheduler gives batches to it, which puts them onto the instance's thread
                async with trio.open_nursery() as starting:
                    for placement, signature in zip(placements, config.instance_signatures(),
                                                    strict=True):
                        starting.start_soon(start, config, placement, signature, live)
                live = dict(sorted(live.items()))  # each started, or we raised
                await version_nursery.start(
                    partial(
                        scheduler.run,
                        name=config.name,
                        policy=choice.policy,
                        inbox=inbox,
                        instances=[i.intake for i in live.values()],
                        preserve_ordering=bool(config.batching
                                               and config.batching.preserve_ordering),
                        summaries=summaries,
                        # a decoupled model's first responses are counted as they are sent
                        first_response=(() if config.decoupled
                                        else config.first_response_buckets),
                        limiter=rate_limiter if granted else None,
                    )
                )

                def healthy() -> bool:
                    return all(i.intake.healthy() for i in list(live.values()))

                async def unready() -> str | None:
                    for instance in list(live.values()):
                        reason = await instance.intake.unready()
                        if reason is not None:
                            return reason  # the first instance that is not (Triton's way)
                    return None

                async def resize(new: ModelConfig) -> ModelHandle:
                    """Serve ``new`` (equal to the served configuration but for its
                    instance groups): start the instances it adds, then retire the ones it
                    drops; returns once the added ones serve and the retired ones that no
                    sequence holds have finished (their running batches first)."""
                    nonlocal next_index
                    unmatched: dict[bytes, list[int]] = {}
                    for index, instance in live.items():
                        unmatched.setdefault(instance.signature, []).append(index)
                    adding: list[tuple[InstancePlacement, bytes]] = []
                    for placement, signature in zip(new.placements(),
                                                    new.instance_signatures(), strict=True):
                        same = unmatched.get(signature)
                        if same:
                            same.pop(0)  # an instance like it serves already: it stays
                        else:
                            adding.append((dataclasses.replace(placement, index=next_index),
                                           signature))
                            next_index += 1
                    retiring = tuple(i for indices in unmatched.values() for i in indices)
                    added: dict[int, _Instance] = {}
                    try:
                        async with trio.open_nursery() as starting:
                            for placement, signature in adding:
                                starting.start_soon(start, new, placement, signature, added)
                    except BaseException:
                        for instance in added.values():  # the update fails as a whole
                            instance.intake.close()
                        raise
                    closing: tuple[int, ...] = await mailbox.ask(
                        intake, lambda reply: UpdateInstances(
                            {i: a.intake for i, a in added.items()}, retiring, reply),
                        gone=f"model '{config.name}' version {version} is unloading")
                    gone = {i: live.pop(i) for i in retiring}
                    live.update(added)
                    if adding or retiring:
                        log.info("model '%s' version %d: %d instance(s) added, %d removed, "
                                 "%d kept", config.name, version, len(added), len(retiring),
                                 len(live) - len(added))
                    for index in closing:
                        await gone[index].ended.wait()
                    return ModelHandle(new.name, version, new, intake, healthy, unready)

                task_status.started((ModelHandle(config.name, version, config, intake, healthy,
                                                 unready),
                                     intake.clone(), resize))
    finally:
        intake.close()
        done.set()


async def serve_ensemble(
    *,
    config: ModelConfig,
    version: int,
    client: ModelClient,
    faults: FaultCounter,
    summaries: bool,
    scope: trio.CancelScope,
    done: trio.Event,
    task_status: Started,
) -> None:
    """An ensemble version: its EnsembleScheduler, whose steps call their models through
    ``client`` (the composing models were checked by the manager before)."""
    assert config.ensemble is not None
    intake, inbox = trio.open_memory_channel[Any](math.inf)
    try:
        with scope:
            async with trio.open_nursery() as version_nursery:
                await version_nursery.start(partial(
                    ensemble.run, plan=config.ensemble, version=str(version),
                    infer=client.infer_one, inbox=inbox,
                    stream=client.stream if config.decoupled else None, faults=faults,
                    summaries=summaries, client=client, config=config))
                task_status.started((ModelHandle(config.name, version, config, intake),
                                     intake.clone(), None))
    finally:
        intake.close()
        done.set()

