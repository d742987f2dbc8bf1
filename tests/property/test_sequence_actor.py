"""The sequence batcher running: ModelManager, scheduler actor, real instance workers (their
threads and slot state) and a fake accumulator backend, on trio's virtual clock.

Random scenarios (strategy, instances, slots, more sequences than slots, think times,
sequences abandoned without END, pauses longer than the idle timeout) drive clients that send
each sequence's requests in order through ``Core.infer``. Afterwards:

- every request got exactly one answer, and every answer is its own sequence's running sum
  (state never mixes across sequences, START begins from the initial state);
- a continuation after a pause longer than ``max_sequence_idle_microseconds`` gets Triton's
  START error (the idle sequence was released), and a new START works again;
- a live sequence's rows always ran on one instance, with its correlation ID in CORRID and
  START only on its first row; padding rows were not READY;
- once everything ended or idled out, a full set of new sequences gets every slot (no slot
  leaked) and the model unloads cleanly, closing its instances.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery import messages
from nursery.actors import model_manager
from nursery.actors.directory import Directory
from nursery.backends.base import Backends
from nursery.core import Core
from nursery.errors import ErrorKind, NurseryError
from nursery.runtime.devices import InstancePlacement
from nursery.types import DataType, InferenceRequest, Tensor

CONFIG = """
backend: "fakeseq"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32
            dims: [ 1 ] initial_state {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true
            name: "zero" }} }} ]
}}
"""


class Accumulator:
    """OUTPUT = INPUT + INPUT_STATE = OUTPUT_STATE; records every row it ran."""

    def __init__(self, factory: AccumulatorFactory, placement: InstancePlacement) -> None:
        self.factory = factory
        self.index = placement.index

    def execute(self, inputs: Mapping[str, np.ndarray],
                output_names: Sequence[str]) -> dict[str, np.ndarray]:
        self.factory.threads.setdefault(self.index, set()).add(threading.get_ident())
        if self.factory.gate is not None:  # a test holds the batch on the instance's thread
            self.factory.gate.wait(30)
        total = inputs["INPUT"] + inputs["INPUT_STATE"]
        for row in range(total.shape[0]):
            self.factory.rows.append((self.index, int(inputs["CORRID"][row, 0]),
                                      int(inputs["START"][row, 0]),
                                      float(inputs["READY"][row, 0])))
        return {"OUTPUT": total, "OUTPUT_STATE": total}

    def close(self) -> None:
        self.factory.closed.append(self.index)


class AccumulatorFactory:
    name = "fakeseq"
    platform = ""
    default_filename = "model.fake"

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, float]] = []  # (instance, corrid, start, ready)
        self.threads: dict[int, set[int]] = {}
        self.closed: list[int] = []
        self.gate: threading.Event | None = None

    def auto_complete(self, config: Any, version_path: Path) -> None:
        pass

    def load(self, config: Any, version_path: Path, placement: InstancePlacement) -> Accumulator:
        return Accumulator(self, placement)


def _request(value: float, sid: int, start: bool = False, end: bool = False) -> InferenceRequest:
    data = np.array([[value]], dtype=np.float32)
    return InferenceRequest("acc", "", {"INPUT": Tensor("INPUT", DataType.FP32, (1, 1), data)},
                            sequence_id=sid, sequence_start=start, sequence_end=end)


# a client's plan: (think time before each request, values), whether it ends, and whether it
# pauses past the idle timeout before its last request
plans = st.lists(
    st.tuples(st.lists(st.sampled_from([0.0, 0.0005, 0.003]), min_size=1, max_size=5),
              st.booleans(), st.booleans(), st.sampled_from([0.0, 0.0, 0.002, 0.01])),
    min_size=1, max_size=10)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(["direct { }", "oldest { max_candidate_sequences: 2 }",
                                 "oldest { max_candidate_sequences: 3 preferred_batch_size: [ 1 ] "
                                 "max_queue_delay_microseconds: 1000 }"]),
       mbs=st.integers(1, 3), instances=st.integers(1, 2), schedule=plans)
def test_sequence_batcher_running(tmp_path_factory: Any, strategy: str, mbs: int,
                                  instances: int, schedule: list[Any]) -> None:
    repo = tmp_path_factory.mktemp("repo")
    idle = 0.05
    (repo / "acc" / "1").mkdir(parents=True)
    (repo / "acc" / "config.pbtxt").write_text(CONFIG.format(
        mbs=mbs, instances=instances, idle_us=int(idle * 1e6), strategy=strategy))
    factory = AccumulatorFactory()
    answers: dict[int, list[Any]] = {}
    expected: dict[int, list[Any]] = {}

    async def client(core: Core, n: int, plan: Any) -> None:
        thinks, ends, pauses, start_delay = plan
        sid = 1000 + n
        got: list[Any] = answers.setdefault(n, [])
        want: list[Any] = expected.setdefault(n, [])
        await trio.sleep(start_delay)
        total = 0.0
        for k, think in enumerate(thinks):
            await trio.sleep(think)
            value = float(n * 10 + k + 1)
            last = k == len(thinks) - 1
            if last and pauses and k > 0:  # the sequence idles out before this request
                await trio.sleep(idle * 2)
                try:
                    await core.infer(_request(value, sid, end=ends))
                    got.append("ran")
                except NurseryError as exc:
                    got.append((exc.kind, exc.message))
                want.append((ErrorKind.INVALID_ARG,
                             f"inference request for sequence {sid} to model 'acc' must "
                             "specify the START flag on the first request of the sequence"))
                total = 0.0  # and it starts again, from fresh state
                response = await core.infer(_request(value, sid, start=True, end=True))
                got.append(float(response.outputs[0].data[0, 0]))
                want.append(value)
                return
            response = await core.infer(_request(value, sid, start=k == 0, end=last and ends))
            total += value
            got.append(float(response.outputs[0].data[0, 0]))
            want.append(total)

    async def main() -> None:
        directory = Directory()
        async with trio.open_nursery() as nursery:
            commands, inbox = trio.open_memory_channel[Any](4)
            failed = await nursery.start(partial(
                model_manager.run, repositories=(repo,), directory=directory, inbox=inbox,
                backends=Backends({"fakeseq": factory}),
                startup_models=["acc"], exit_on_error=False, unload_timeout=5.0))
            assert failed == []
            core = Core.over(directory)
            # (no fail_after: while an instance thread computes, the autojump clock would
            # leap to its deadline; a hang shows as a hung test)
            async with trio.open_nursery() as clients:
                for n, plan in enumerate(schedule):
                    clients.start_soon(client, core, n, plan)
            await trio.sleep(idle * 2)  # whatever did not end idles out
            slots = instances * (mbs if strategy.startswith("direct") else
                                 int(strategy.split("max_candidate_sequences: ")[1][0]))
            fresh: dict[int, float] = {}

            async def one(i: int) -> None:  # every slot free again: all run at once
                r = await core.infer(_request(1.0, 5000 + i, start=True))
                fresh[i] = float(r.outputs[0].data[0, 0])

            async with trio.open_nursery() as again:
                for i in range(slots):
                    again.start_soon(one, i)
            assert fresh == dict.fromkeys(range(slots), 1.0)
            send, receive = trio.open_memory_channel[Any](1)
            await commands.send(messages.UnloadModel("acc", send))
            assert await receive.receive() is None
            await commands.aclose()

    # a small real-time threshold: the instance threads close their backends in real time, and a
    # jump of the virtual clock while one is closing would count it as hung (abandoned)
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.002))

    for n in range(len(schedule)):
        assert answers[n] == expected[n], f"sequence {n}: {answers[n]} != {expected[n]}"
    assert sorted(factory.closed) == list(range(instances))  # unload closed every instance
    for threads in factory.threads.values():
        assert len(threads) == 1  # an instance ran on its own thread only
    # a sequence's rows stayed on one instance while it lived (between STARTs)
    where: dict[int, int] = {}
    for instance, corrid, start, ready in factory.rows:
        if ready == 0.0:
            assert corrid == 0 and start == 0  # padding rows carry nothing
            continue
        if start:
            where[corrid] = instance
        assert where.get(corrid) == instance, "a live sequence moved to another instance"
