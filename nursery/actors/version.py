"""Serving one model version: its own nursery holding its instance workers and its scheduler
(or, for an ensemble, its EnsembleScheduler). The ModelManager starts one of these per version
inside its supervision boundary, and stops it by closing its intake (drain) or cancelling it."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import trio

from nursery.actors import ensemble, instance_worker, scheduler
from nursery.actors.directory import ModelHandle
from nursery.actors.model_client import ModelClient
from nursery.backends.base import BackendFactory
from nursery.config.model import ModelConfig
from nursery.config.warmup import WarmupSample
from nursery.messages import InferWork
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.selection import PolicyChoice, policy_for

Started = trio.TaskStatus[tuple[ModelHandle, trio.MemorySendChannel[Any]]]


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
    scheduler; then report the version's handle and the scheduler's control channel."""
    placements = config.placements()
    # Unbounded: internal notices (InstanceReady, CloseIntake) must always get in. The
    # scheduler takes every message at once; its policy bounds the queue it keeps.
    intake, inbox = trio.open_memory_channel[Any](math.inf)
    choice: PolicyChoice[InferWork] = policy_for(config, len(placements),
                                                 describe=lambda work: work.request,
                                                 signature=lambda work: work.signature)
    try:
        with scope:
            async with trio.open_nursery() as version_nursery:
                # each worker hands back its intake once its instance is loaded: the
                # scheduler gives batches to it, which puts them onto the instance's thread
                intakes: list[instance_worker.WorkerIntake | None] = [None] * len(placements)

                async def start_worker(index: int, run: Any) -> None:
                    intakes[index] = await version_nursery.start(run)

                async with trio.open_nursery() as starting:
                    for index, placement in enumerate(placements):
                        starting.start_soon(
                            start_worker, index,
                            partial(
                                instance_worker.run,
                                config=config,
                                version=str(version),
                                version_path=version_path,
                                placement=placement,
                                factory=factory,
                                scheduler=intake.clone(),
                                slots=choice.slots,
                                warmup=warmup,
                                rate_limiter=rate_limiter,
                                client=client,
                            ),
                        )
                workers = [w for w in intakes if w is not None]  # each started, or we raised
                await version_nursery.start(
                    partial(
                        scheduler.run,
                        name=config.name,
                        policy=choice.policy,
                        inbox=inbox,
                        instances=workers,
                        preserve_ordering=bool(config.batching
                                               and config.batching.preserve_ordering),
                        summaries=summaries,
                    )
                )

                def healthy() -> bool:
                    return all(w.healthy() for w in workers)

                async def unready() -> str | None:
                    for worker in workers:
                        reason = await worker.unready()
                        if reason is not None:
                            return reason  # the first instance that is not (Triton's way)
                    return None

                task_status.started((ModelHandle(config.name, version, config, intake, healthy,
                                                 unready),
                                     intake.clone()))
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
                    summaries=summaries))
                task_status.started((ModelHandle(config.name, version, config, intake),
                                     intake.clone()))
    finally:
        intake.close()
        done.set()

