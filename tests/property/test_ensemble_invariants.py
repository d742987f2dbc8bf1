"""Ensembles as random DAGs, through the running EnsembleScheduler actor on trio's virtual
clock: steps are identity-like fake models (each output = the sum of its inputs plus a
constant) that take a random time and sometimes fail. Every request gets exactly one answer:
the right tensors (checked against evaluating the graph directly), or the failing step's
error; requests run concurrently and steps of one request overlap where the graph allows."""

from __future__ import annotations

import math
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.actors import ensemble
from nursery.errors import ConfigError, ErrorKind, InternalError, InvalidArgument, NurseryError
from nursery.messages import CancelWork, CloseIntake, InferWork, Part
from nursery.scheduling.ensemble_plan import EnsemblePlan, EnsembleStep, IterFlow, reshape_dims
from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor


@st.composite
def graphs(draw: st.DrawFn) -> tuple[EnsemblePlan, dict[str, int]]:
    """A random DAG: each step reads tensors that exist before it (so no cycle), writes 1-2
    new ones; the steps are then listed in a random order."""
    inputs = [f"in{i}" for i in range(draw(st.integers(1, 3)))]
    available = list(inputs)
    steps = []
    consts: dict[str, int] = {}
    for i in range(draw(st.integers(1, 6))):
        reads = draw(st.lists(st.sampled_from(available), min_size=1, max_size=3, unique=True))
        writes = [f"s{i}_o{j}" for j in range(draw(st.integers(1, 2)))]
        steps.append(EnsembleStep(
            f"m{i}", -1,
            {f"IN{k}": t for k, t in enumerate(reads)},
            {f"OUT{j}": t for j, t in enumerate(writes)}))
        for j in range(len(writes)):
            consts[f"m{i}/OUT{j}"] = draw(st.integers(-5, 5))
        available += writes
    produced = [t for s in steps for t in s.output_map.values()]
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=4, unique=True))
    order = draw(st.permutations(steps))
    return EnsemblePlan.build("ens", inputs, outputs, order), consts


def evaluate(plan: EnsemblePlan, consts: dict[str, int], inputs: dict[str, int]) -> dict[str, int]:
    values = dict(inputs)
    pending = list(plan.steps)
    while pending:
        for step in pending:
            if all(t in values for t in step.input_map.values()):
                total = sum(values[t] for t in step.input_map.values())
                for out, t in step.output_map.items():
                    values[t] = total + consts[f"{step.model_name}/{out}"]
                pending.remove(step)
                break
    return values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), values=st.lists(st.integers(0, 50), min_size=1, max_size=12),
       delays=st.lists(st.sampled_from([0.0, 0.001, 0.01]), min_size=1, max_size=8),
       failing=st.integers(-1, 5))
def test_every_request_gets_one_correct_answer(graph: tuple[EnsemblePlan, dict[str, int]],
                                               values: list[int], delays: list[float],
                                               failing: int) -> None:
    plan, consts = graph
    answers: dict[int, list[Any]] = {}
    calls = [0]
    running = [0]
    overlap = [0]

    async def infer(request: InferenceRequest) -> InferenceResponse:
        calls[0] += 1
        running[0] += 1
        overlap[0] = max(overlap[0], running[0])
        try:
            await trio.sleep(delays[calls[0] % len(delays)])
        finally:
            running[0] -= 1
        total = sum(int(t.data[0]) for t in request.inputs.values())
        if request.model_name == f"m{failing}" and total % 3 == 0:
            raise InternalError(f"model '{request.model_name}' refused {total}")
        assert {o.name for o in request.requested_outputs} == set(
            next(s for s in plan.steps if s.model_name == request.model_name).output_map)
        outputs = []
        for out in request.requested_outputs:
            value = total + consts[f"{request.model_name}/{out.name}"]
            arr = np.array([value], dtype=np.int64)
            outputs.append(Tensor(out.name, DataType.INT64, (1,), arr))
        return InferenceResponse(request.model_name, "1", outputs, id=request.id)

    async def main() -> None:
        intake, inbox = trio.open_memory_channel[Any](1000)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(ensemble.run, plan=plan, version="1", infer=infer,
                                        inbox=inbox))

            async def client(i: int, value: int) -> None:
                send, receive = trio.open_memory_channel[Any](1)
                inputs = {n: Tensor(n, DataType.INT64, (1,), np.array([value + k], np.int64))
                          for k, n in enumerate(plan.inputs)}
                request = InferenceRequest("ens", "", inputs, id=str(i))
                await intake.send(InferWork(request, send, 1, time.monotonic_ns()))
                got = [await receive.receive()]
                with trio.move_on_after(1):  # nothing else may come
                    got.append(await receive.receive())
                answers[i] = got

            async with trio.open_nursery() as clients:
                for i, value in enumerate(values):
                    clients.start_soon(client, i, value)
            await intake.send(CloseIntake())
            await intake.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sorted(answers) == list(range(len(values)))
    for i, value in enumerate(values):
        assert len(answers[i]) == 1, f"request {i} got {answers[i]}"
        answer = answers[i][0]
        inputs = {n: value + k for k, n in enumerate(plan.inputs)}
        expected = evaluate(plan, consts, inputs)
        needed = _needed_by_fixpoint(plan, list(plan.outputs))  # the others are pruned
        fails = [s for s in plan.steps if s.model_name == f"m{failing}"
                 and s.model_name in needed
                 and sum(expected[t] for t in s.input_map.values()) % 3 == 0]
        if fails:
            assert isinstance(answer, NurseryError)
            assert answer.message.startswith("in ensemble 'ens', model 'm")
            assert "refused" in answer.message
            continue
        assert isinstance(answer, InferenceResponse), answer
        assert answer.id == str(i)
        got = {t.name: int(t.data[0]) for t in answer.outputs}
        assert got == {n: expected[n] for n in plan.outputs}


def _needed_by_fixpoint(plan: EnsemblePlan, requested: list[str]) -> set[str]:
    """Triton's pruning, restated: a step runs when one of its outputs is requested or read
    by a step that runs."""
    needed: set[str] = set()
    while True:
        wanted = set(requested) | {t for s in plan.steps if s.model_name in needed
                                   for t in s.input_map.values()}
        grown = {s.model_name for s in plan.steps if wanted & set(s.output_map.values())}
        if grown == needed:
            return needed
        needed = grown


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), data=st.data(), omit=st.integers(-1, 5),
       mode=st.sampled_from(["flow", "decoupled", "callbacks"]))
def test_only_needed_steps_run_and_absent_outputs_are_left_out(
        graph: tuple[EnsemblePlan, dict[str, int]], data: st.DataObject, omit: int,
        mode: str) -> None:
    """Triton's ensemble scheduler: steps that no requested output needs are pruned (never
    called); a step that does not produce one of its outputs leaves that tensor absent: the
    steps reading it get no such input (these models take their inputs as optional) and the
    answer leaves it out, with no error. For ordinary flows (a task per request), decoupled
    flows, and flows driven by their steps' answers (``CallbackFlow``: the queued step
    requests are answered in an order hypothesis picks)."""
    decoupled = mode == "decoupled"
    plan, consts = graph
    requested = data.draw(st.lists(st.sampled_from(plan.outputs), min_size=1, unique=True))
    called: list[str] = []

    def compute(request: InferenceRequest) -> InferenceResponse:
        called.append(request.model_name)
        total = sum(int(t.data[0]) for t in request.inputs.values())
        outputs = [Tensor(o.name, DataType.INT64, (1,),
                          np.array([total + consts[f"{request.model_name}/{o.name}"]], np.int64))
                   for o in request.requested_outputs
                   if not (request.model_name == f"m{omit}" and o.name == "OUT0")]
        return InferenceResponse(request.model_name, "1", outputs, id=request.id)

    async def infer(request: InferenceRequest) -> InferenceResponse:
        await trio.sleep(0.001)
        return compute(request)

    async def stream(request: InferenceRequest, on_part: Any) -> None:
        await trio.sleep(0.001)
        await on_part(Part(compute(request), None, True))

    inputs = {n: Tensor(n, DataType.INT64, (1,), np.array([k + 1], np.int64))
              for k, n in enumerate(plan.inputs)}
    request = InferenceRequest("ens", "", inputs, tuple(RequestedOutput(o) for o in requested))
    parts: list[Any] = []

    async def main() -> Any:
        if decoupled:
            await ensemble.run_decoupled_flow(plan, "1", request, stream, parts.append)
            return None
        return await ensemble.run_flow(plan, "1", request, infer)

    if mode == "callbacks":
        answer = _by_callbacks(plan, request, compute, data)
    else:
        answer = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if decoupled:
        assert [p.final for p in parts] == [True] and parts[0].error is None
        answer = parts[0].response
    # the expected values, with absent tensors
    values: dict[str, int] = {n: k + 1 for k, n in enumerate(plan.inputs)}
    absent: set[str] = set()
    pending = list(plan.steps)
    while pending:
        step = next(s for s in pending
                    if all(t in values or t in absent for t in s.input_map.values()))
        pending.remove(step)
        total = sum(values[t] for t in step.input_map.values() if t in values)
        for out, t in step.output_map.items():
            if step.model_name == f"m{omit}" and out == "OUT0":
                absent.add(t)
            else:
                values[t] = total + consts[f"{step.model_name}/{out}"]
    assert sorted(called) == sorted(_needed_by_fixpoint(plan, requested))
    assert {t.name: int(t.data[0]) for t in answer.outputs} == {
        n: values[n] for n in requested if n not in absent}
    assert [t.name for t in answer.outputs] == [n for n in requested if n not in absent]


def _by_callbacks(plan: EnsemblePlan, request: InferenceRequest,
                  compute: Any, data: st.DataObject) -> Any:
    """A CallbackFlow over a client that queues each dispatched step request; the queued
    requests are answered in an order ``data`` draws, each answer given where a model would
    give it (on_answer), until the flow gives its answer, exactly once."""
    queued: list[tuple[InferenceRequest, Any]] = []
    answers: list[Any] = []

    class Client:
        tracer = SimpleNamespace(active=False)
        cache = None

        def resolve(self, name: str, version: str = "", namespace: str | None = None) -> Any:
            return SimpleNamespace(name=name, config=SimpleNamespace(decoupled=False))

        def dispatch(self, step_request: InferenceRequest, handle: Any, on_answer: Any) -> Any:
            queued.append((step_request, on_answer))
            return lambda: None

    flow = ensemble.CallbackFlow(plan, "1", request, Client(), answers.append,
                                 spawn=lambda *_: pytest.fail("no step needs a task"))
    flow.start()
    while queued:
        step_request, on_answer = queued.pop(data.draw(st.integers(0, len(queued) - 1)))
        on_answer(compute(step_request))
    assert len(answers) == 1
    return answers[0]


def test_requested_outputs_and_independent_steps_overlap() -> None:
    plan = EnsemblePlan.build("e", ["x"], ["a", "b"], [
        EnsembleStep("ma", -1, {"IN": "x"}, {"OUT": "a"}),
        EnsembleStep("mb", -1, {"IN": "x"}, {"OUT": "b"}),
    ])
    running: list[int] = [0, 0]
    called: list[str] = []

    async def infer(request: InferenceRequest) -> InferenceResponse:
        called.append(request.model_name)
        running[0] += 1
        running[1] = max(running)
        await trio.sleep(1)
        running[0] -= 1
        t = request.inputs["IN"]
        return InferenceResponse(request.model_name, "1", [Tensor("OUT", t.datatype, t.shape, t.data)])

    async def main() -> None:
        x = Tensor("x", DataType.FP32, (2,), np.array([1, 2], np.float32))
        request = InferenceRequest("e", "", {"x": x}, (RequestedOutput("b"),))
        response = await ensemble.run_flow(plan, "1", request, infer)
        assert [t.name for t in response.outputs] == ["b"]
        assert response.outputs[0].data is x.data  # passed along, never copied
        assert called == ["mb"]  # "a" was not asked for: its step is pruned
        request = InferenceRequest("e", "", {"x": x}, (RequestedOutput("b"), RequestedOutput("a")))
        start = trio.current_time()
        response = await ensemble.run_flow(plan, "1", request, infer)
        assert trio.current_time() - start == pytest.approx(1.0)  # both steps at once
        assert [t.name for t in response.outputs] == ["b", "a"]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert running[1] == 2


@pytest.mark.parametrize(("steps", "outputs", "message"), [
    ([], ["y"], "must have at least one step"),
    ([EnsembleStep("m", -1, {"IN": "nope"}, {"OUT": "y"})], ["y"],
     "reads ensemble tensor 'nope', which is neither an ensemble input nor written"),
    ([EnsembleStep("m", -1, {"IN": "x"}, {"OUT": "y"})], ["z"],
     "output 'z' is not written by any step"),
    ([EnsembleStep("m", -1, {"IN": "x"}, {"OUT": "y"}),
      EnsembleStep("n", -1, {"IN": "x"}, {"OUT": "y"})], ["y"], "exactly one producer"),
    ([EnsembleStep("m", -1, {"IN": "x", "IN2": "b"}, {"OUT": "a"}),
      EnsembleStep("n", -1, {"IN": "a"}, {"OUT": "b"})], ["a"], "has a cycle"),
    ([EnsembleStep("m", -1, {"IN": "x"}, {"OUT": "x"})], ["x"], "which is an input"),
])
def test_invalid_graphs_are_refused(steps: list[EnsembleStep], outputs: list[str],
                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EnsemblePlan.build("e", ["x"], outputs, steps)


def test_cancel_stops_running_steps_and_close_refuses_new_requests() -> None:
    plan = EnsemblePlan.build("e", ["x"], ["a"], [EnsembleStep("slow", -1, {"IN": "x"}, {"OUT": "a"})])
    cancelled: list[bool] = []

    async def infer(request: InferenceRequest) -> InferenceResponse:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled.append(True)
            raise
        raise AssertionError("not reached")

    async def main() -> None:
        intake, inbox = trio.open_memory_channel[Any](100)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(ensemble.run, plan=plan, version="1", infer=infer,
                                        inbox=inbox))
            x = Tensor("x", DataType.FP32, (1,), np.zeros(1, np.float32))
            send, receive = trio.open_memory_channel[Any](1)
            work = InferWork(InferenceRequest("e", "", {"x": x}), send, 1, time.monotonic_ns())
            await intake.send(work)
            await trio.sleep(1)
            await intake.send(CancelWork(work))
            answer = await receive.receive()
            assert isinstance(answer, NurseryError) and answer.kind is ErrorKind.CANCELLED
            await intake.send(CloseIntake())
            send2, receive2 = trio.open_memory_channel[Any](1)
            await intake.send(InferWork(InferenceRequest("e", "", {"x": x}), send2, 1, 0))
            late = await receive2.receive()
            assert isinstance(late, NurseryError) and "unloading" in late.message
            await intake.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert cancelled == [True]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=6),
       delays=st.lists(st.sampled_from([0.0, 0.001, 0.01]), min_size=1, max_size=8))
def test_decoupled_ensemble_answers_once_per_iteration_then_final(
        counts: list[int], delays: list[float]) -> None:
    """in -> gen (decoupled: n responses, in + j) -> post (+100) -> OUT, and gen's IDX is an
    output too: a request answers exactly n times, OUT = in + j + 100 beside IDX = j, then
    carries the final flag exactly once (on its last answer, or alone when n is 0)."""
    from nursery.messages import Part

    plan = EnsemblePlan.build("dec", ["IN"], ["OUT", "IDX"], [
        EnsembleStep("gen", -1, {"X": "IN"}, {"Y": "G", "J": "IDX"}),
        EnsembleStep("post", -1, {"X": "G"}, {"Y": "OUT"}),
    ])
    calls = [0]

    def tensor(name: str, value: int) -> Tensor:
        return Tensor(name, DataType.INT64, (1,), np.array([value], np.int64))

    async def stream(request: InferenceRequest, on_part: Any) -> None:
        calls[0] += 1
        x = int(request.inputs["X"].data[0])
        if request.model_name == "post":
            await trio.sleep(delays[calls[0] % len(delays)])
            await on_part(Part(InferenceResponse("post", "1", [tensor("Y", x + 100)]), None, True))
            return
        n = x // 1000  # the request says how many answers it wants
        for j in range(n):
            await trio.sleep(delays[(calls[0] + j) % len(delays)])
            await on_part(Part(InferenceResponse("gen", "1", [tensor("Y", x + j),
                                                              tensor("J", j)]), None, False))
        await on_part(Part(None, None, True))

    answers: dict[int, list[Any]] = {}

    async def main() -> None:
        intake, inbox = trio.open_memory_channel[Any](1000)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(ensemble.run, plan=plan, version="1", infer=None,
                                        inbox=inbox, stream=stream))

            async def client(i: int, n: int) -> None:
                send, receive = trio.open_memory_channel[Any](math.inf)
                request = InferenceRequest("dec", "", {"IN": tensor("IN", 1000 * n + i)},
                                           id=str(i))
                await intake.send(InferWork(request, send, 1, time.monotonic_ns()))
                got = []
                while not got or not got[-1].final:
                    got.append(await receive.receive())
                with trio.move_on_after(1):  # nothing may follow the final part
                    got.append(await receive.receive())
                answers[i] = got

            async with trio.open_nursery() as clients:
                for i, n in enumerate(counts):
                    clients.start_soon(client, i, n)
            await intake.send(CloseIntake())
            await intake.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for i, n in enumerate(counts):
        parts = answers[i]
        assert [p.final for p in parts] == [False] * (len(parts) - 1) + [True]
        assert all(p.error is None for p in parts)
        responses = [p.response for p in parts if p.response is not None]
        assert len(parts) in (n, n + 1) and len(responses) == n
        by_name = [{t.name: int(t.data[0]) for t in r.outputs} for r in responses]
        got = sorted((d["IDX"], d["OUT"]) for d in by_name)
        assert got == [(j, 1000 * n + i + j + 100) for j in range(n)]
        assert all(r.id == str(i) and r.model_name == "dec" for r in responses)


@st.composite
def graphs_with_absent_inputs(draw: st.DrawFn) -> tuple[EnsemblePlan, dict[str, int], set[str]]:
    """A random DAG whose ensemble inputs are optional at random, and the optional ones a
    request leaves out."""
    plan, consts = draw(graphs())
    optional = draw(st.sets(st.sampled_from(plan.inputs)))
    plan = EnsemblePlan.build(plan.name, plan.inputs, plan.outputs, plan.steps, optional)
    omitted = draw(st.sets(st.sampled_from(sorted(optional)))) if optional else set()
    return plan, consts, omitted


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs_with_absent_inputs(), decoupled=st.booleans(), value=st.integers(0, 50))
def test_optional_inputs_left_out_are_left_out_of_the_steps(
        graph: tuple[EnsemblePlan, dict[str, int], set[str]], decoupled: bool,
        value: int) -> None:
    """Triton's ensemble scheduler: an optional ensemble input a request leaves out is an empty
    placeholder, so every step still runs once, and a step that reads it gets a request
    without that input (never a KeyError, never a step left waiting)."""
    from nursery.messages import Part

    plan, consts, omitted = graph
    seen: dict[str, set[str]] = {}

    def answer(request: InferenceRequest) -> InferenceResponse:
        assert request.model_name not in seen, "a step ran twice"
        seen[request.model_name] = set(request.inputs)
        total = sum(int(t.data[0]) for t in request.inputs.values())
        return InferenceResponse(request.model_name, "1", [
            Tensor(o.name, DataType.INT64, (1,),
                   np.array([total + consts[f"{request.model_name}/{o.name}"]], np.int64))
            for o in request.requested_outputs])

    async def infer(request: InferenceRequest) -> InferenceResponse:
        await trio.sleep(0.001)
        return answer(request)

    async def stream(request: InferenceRequest, on_part: Any) -> None:
        await trio.sleep(0.001)
        await on_part(Part(answer(request), None, True))

    given_inputs = {n: value + k for k, n in enumerate(plan.inputs) if n not in omitted}
    got: list[Any] = []

    async def main() -> None:
        intake, inbox = trio.open_memory_channel[Any](10)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(ensemble.run, plan=plan, version="1", infer=infer,
                                        inbox=inbox, stream=stream if decoupled else None))
            send, receive = trio.open_memory_channel[Any](math.inf)
            request = InferenceRequest("ens", "", {
                n: Tensor(n, DataType.INT64, (1,), np.array([v], np.int64))
                for n, v in given_inputs.items()})
            await intake.send(InferWork(request, send, 1, time.monotonic_ns()))
            got.append(await receive.receive())
            while decoupled and not got[-1].final:  # parts, up to the final flag
                got.append(await receive.receive())
            with trio.move_on_after(1):  # nothing else may come
                got.append(await receive.receive())
            await intake.send(CloseIntake())
            await intake.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if decoupled:  # one answer (iteration 0), then the final flag (on it, or alone)
        assert got[-1].final and all(p.error is None for p in got), got
        responses = [p.response for p in got if p.response is not None]
        assert len(responses) == 1, got
        response = responses[0]
    else:
        assert len(got) == 1, got
        response = got[0]
    assert isinstance(response, InferenceResponse), got
    needed = plan.needed(plan.outputs)  # the others are pruned, as in Triton
    assert set(seen) == {plan.steps[i].model_name for i in needed}
    for i in needed:  # every needed step ran, without the inputs left out
        step = plan.steps[i]
        assert seen[step.model_name] == {i for i, t in step.input_map.items() if t not in omitted}
    expected = evaluate(plan, consts, {n: given_inputs.get(n, 0) for n in plan.inputs})
    assert {t.name: int(t.data[0]) for t in response.outputs} == {n: expected[n]
                                                                  for n in plan.outputs}


def test_request_inputs_leave_out_absent_tensors() -> None:
    step = EnsembleStep("m", -1, {"IN": "x", "BIAS": "b", "MASK": "k"}, {"OUT": "y"})
    assert step.request_inputs({"x": 1, "k": None}) == {"IN": 1}
    plan = EnsemblePlan.build("e", ["x", "b"], ["y"], [step_reading("x", "b")], ["b"])
    flow = IterFlow(plan)
    updates = flow.add_inputs({"x": 5})
    assert flow.ready(updates) == [(0, 0)]  # the step runs without b
    assert flow.inputs(0, 0) == {"IN0": 5}
    with pytest.raises(ConfigError, match="optional input 'z' is not an input"):
        EnsemblePlan.build("e", ["x"], ["y"], [step_reading("x")], ["z"])


def step_reading(*tensors: str) -> EnsembleStep:
    return EnsembleStep("m", -1, {f"IN{i}": t for i, t in enumerate(tensors)}, {"OUT": "y"})


def test_run_flow_without_an_optional_input() -> None:
    """The regression of issue 22: run_flow looked the left-out input up (KeyError)."""
    plan = EnsemblePlan.build("e", ["x", "b"], ["y"], [step_reading("x", "b")], ["b"])
    requests: list[InferenceRequest] = []

    async def infer(request: InferenceRequest) -> InferenceResponse:
        requests.append(request)
        t = request.inputs["IN0"]
        return InferenceResponse("m", "1", [Tensor("OUT", t.datatype, t.shape, t.data)])

    async def main() -> None:
        x = Tensor("x", DataType.FP32, (1,), np.ones(1, np.float32))
        response = await ensemble.run_flow(plan, "1", InferenceRequest("e", "", {"x": x}), infer)
        assert [t.name for t in response.outputs] == ["y"]

    trio.run(main)
    assert [set(r.inputs) for r in requests] == [{"IN0"}]


def test_tensors_gain_or_lose_a_batch_of_one_between_batching_and_not() -> None:
    """Triton's ReshapeTensorDims: only where a batching and a non-batching model meet, and
    only when the shape says which way."""
    # from a non-batching source (batch 0) into a batching model with dims [1]
    assert reshape_dims((1,), True, 0, (1,)) == (1, 1)
    assert reshape_dims((-1,), True, 0, (4,)) == (1, 4)
    assert reshape_dims((1,), True, 0, (3, 1)) == (3, 1)  # already batched: unchanged
    # from a batching source with batch 1 into a non-batching model with dims [1]
    assert reshape_dims((1,), False, 1, (1, 1)) == (1,)
    assert reshape_dims((1, 1), False, 1, (1, 1)) == (1, 1)  # fits as it is
    assert reshape_dims((1,), False, 2, (2, 1)) == (2, 1)  # a batch of 2 cannot be stripped
    # both batch, or neither: unchanged
    assert reshape_dims((1,), True, 1, (1, 1)) == (1, 1)
    assert reshape_dims((1,), False, 0, (1,)) == (1,)


def test_a_shaped_plan_reshapes_step_inputs_and_answers() -> None:
    plan = EnsemblePlan.build("e", ["IN"], ["OUT"], [
        EnsembleStep("batching", -1, {"X": "IN"}, {"Y": "mid"}),
        EnsembleStep("plain", -1, {"X": "mid"}, {"Y": "OUT"}),
    ]).shaped(False, {"OUT": (1,)}, [(True, {"X": (1,)}), (False, {"X": (1,)})])
    assert plan.step_input_shape(0, "X", (1,)) == (1, 1)  # the ensemble does not batch
    assert plan.step_input_shape(1, "X", (1, 1)) == (1,)  # written by a batching model
    assert plan.output_shape("OUT", (1,)) == (1,)


def test_a_callback_flow_fails_once_and_drops_its_other_steps() -> None:
    """CallbackFlow: the first failing step answers the request with its error (Triton's
    words: "in ensemble ..."), the request's other queued steps are abandoned, and an answer
    arriving after that changes nothing; a refused step (its model's check) fails it at once."""
    plan = EnsemblePlan.build("e", ["x"], ["a", "b"], [
        EnsembleStep("ma", -1, {"IN": "x"}, {"OUT": "a"}),
        EnsembleStep("mb", -1, {"IN": "x"}, {"OUT": "b"}),
    ])
    queued: dict[str, Any] = {}
    abandoned: list[str] = []
    answers: list[Any] = []

    class Client:
        tracer = SimpleNamespace(active=False)
        cache = None
        refuse = False

        def resolve(self, name: str, version: str = "", namespace: str | None = None) -> Any:
            return SimpleNamespace(name=name, config=SimpleNamespace(decoupled=False))

        def dispatch(self, step_request: InferenceRequest, handle: Any, on_answer: Any) -> Any:
            if self.refuse:
                raise InvalidArgument(f"unexpected shape for model '{handle.name}'")
            queued[step_request.model_name] = (step_request, on_answer)
            return lambda: abandoned.append(step_request.model_name)

    x = Tensor("x", DataType.FP32, (1,), np.array([1], np.float32))
    request = InferenceRequest("e", "", {"x": x})
    flow = ensemble.CallbackFlow(plan, "1", request, Client(), answers.append,
                                 spawn=lambda *_: pytest.fail("no step needs a task"))
    flow.start()
    assert set(queued) == {"ma", "mb"}
    queued["mb"][1](InvalidArgument("mb says no"))
    assert len(answers) == 1 and isinstance(answers[0], NurseryError)
    assert answers[0].message == "in ensemble 'e', step 1 (model 'mb'): mb says no"
    assert abandoned == ["ma"]
    step_request, on_answer = queued["ma"]
    on_answer(InferenceResponse("ma", "1", [Tensor("OUT", x.datatype, x.shape, x.data)]))
    assert len(answers) == 1  # late: nothing more
    refusing = Client()
    refusing.refuse = True
    answers.clear()
    ensemble.CallbackFlow(plan, "1", request, refusing, answers.append,
                          spawn=lambda *_: None).start()
    assert len(answers) == 1 and "unexpected shape for model 'ma'" in answers[0].message
