"""Fakes for actor tests: instance workers that "compute" with trio.sleep, requests, backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio

from nursery.errors import InternalError
from nursery.messages import ExecuteBatch, InferWork, InstanceReady
from nursery.observability.stats import BatchReport
from nursery.runtime.devices import InstancePlacement
from nursery.types import DataType, InferenceRequest, InferenceResponse, Tensor


def make_request(i: int, rows: int = 1) -> InferenceRequest:
    data = np.full((rows, 2), i, dtype=np.float32)
    return InferenceRequest("m", "", {"INPUT0": Tensor("INPUT0", DataType.FP32, (rows, 2), data)},
                            id=str(i))


def make_work(i: int, rows: int = 1, *, signature: Any = None, priority: int = 0,
              timeout_us: int = 0) -> tuple[InferWork, trio.MemoryReceiveChannel[Any]]:
    send, receive = trio.open_memory_channel[Any](1)
    return InferWork(make_request(i, rows), send, rows, 0, signature, priority, timeout_us), receive


@dataclass
class ExecutionLog:
    """What the fake instances ran: (instance, request ids, start, end) per batch."""

    batches: list[tuple[int, tuple[str, ...], float, float]] = field(default_factory=list)


async def fake_worker(
    index: int,
    inbox: trio.MemoryReceiveChannel[ExecuteBatch],
    scheduler: trio.MemorySendChannel[Any],
    log: ExecutionLog,
    compute: float | Callable[[int], float] = 0.01,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Behaves like an InstanceWorker, with ``trio.sleep`` as its compute time (a number, or a
    function of the instance index)."""
    seconds = compute(index) if callable(compute) else compute
    async with inbox, scheduler:
        task_status.started()
        await scheduler.send(InstanceReady(index))
        async for batch in inbox:
            start = trio.current_time()
            await trio.sleep(seconds)
            log.batches.append((index, tuple(w.request.id for w in batch.work), start,
                                trio.current_time()))
            pairs = [(w, InferenceResponse("m", "1", [], id=w.request.id)) for w in batch.work]
            report = BatchReport(
                batch_size=sum(w.batch_size for w in batch.work), requests=len(batch.work),
                succeeded=True, queue_ns=0, request_ns=0, compute_input_ns=0,
                compute_infer_ns=int(seconds * 1e9), compute_output_ns=0, finished_ms=0)
            if not batch.ordered:
                for w, answer in pairs:
                    try:
                        w.reply.send_nowait(answer)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
            try:
                await scheduler.send(InstanceReady(index, 1, report,
                                                   tuple(pairs) if batch.ordered else ()))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


class FakeInstance:
    """A backend instance: OUTPUT0 = INPUT0 * 2; records the thread of every call."""

    def __init__(self, factory: FakeFactory, placement: InstancePlacement) -> None:
        self.factory = factory
        self.placement = placement
        self.threads: set[int] = set()
        self.inline_safe = factory.inline_safe

    def execute(self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        self.threads.add(threading.get_ident())
        self.factory.executions.append((self.placement.index, inputs["INPUT0"].shape[0]))
        if self.factory.compute:
            time.sleep(self.factory.compute)
        if self.factory.fail_execute:
            raise RuntimeError("backend exploded")
        return {"OUTPUT0": inputs["INPUT0"] * 2}

    def close(self) -> None:
        self.threads.add(threading.get_ident())
        self.factory.closed.append(self.placement.index)


class FakeFactory:
    name = "fake"
    platform = ""
    default_filename = "model.fake"

    def __init__(self) -> None:
        self.fail_load: str | None = None
        self.fail_versions: set[str] = set()  # version folders whose load fails
        self.fail_execute = False
        self.compute = 0.0
        self.inline_safe = False  # may run on the trio thread (InlinePolicy)
        self.instances: list[FakeInstance] = []
        self.executions: list[tuple[int, int]] = []
        self.closed: list[int] = []
        self.load_threads: list[int] = []
        self.load_delay = 0.0  # seconds each instance's load takes (on its loading thread)

    def auto_complete(self, config: Any, version_path: Path) -> None:
        pass

    def load(self, config: Any, version_path: Path, placement: InstancePlacement) -> FakeInstance:
        self.load_threads.append(threading.get_ident())
        if self.load_delay:
            time.sleep(self.load_delay)
        if self.fail_load:
            raise InternalError(self.fail_load)
        if version_path.name in self.fail_versions:
            raise InternalError(f"version {version_path.name} is broken")
        instance = FakeInstance(self, placement)
        instance.threads.add(threading.get_ident())
        self.instances.append(instance)
        return instance


FAKE_CONFIG = """
backend: "fake"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def write_fake_model(repo: Path, name: str, config: str = FAKE_CONFIG,
                     versions: tuple[int, ...] = (1,)) -> Path:
    folder = repo / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True, exist_ok=True)
        (folder / str(v) / "model.fake").write_text("fake")
    (folder / "config.pbtxt").write_text(config)
    return folder
