"""Fault injection: a failure anywhere on the request path or in an actor command costs its own
unit, never the process, and leaks nothing.

Hypothesis picks a point (the backend, batch assembly and split, the scheduling policy, the
instance worker's answer step, a repository command) and the call at which it raises; the
ModelManager then serves two models, ``m`` and ``ok`` (real instance workers on their own
threads, a fake backend), while requests run on both, every other one with its answer handed
to a callback (``ModelClient.dispatch``, the gRPC fast path's way). Afterwards:
- the run itself ended normally (the "process" survived: nothing reached the root);
- every request got exactly one answer, a response or a NurseryError, none hung;
- the fault cost its unit only: one batch (a request-path point), one model's queue (the
  policy), or the command (the manager); the manager still answers commands and ``m`` serves
  again (reloaded by its supervisor, or never down);
- nothing leaked: no request left in a scheduler's queue, no file descriptor left open.

A second test drives the scheduler actor alone on trio's virtual clock with a policy that
raises at a chosen call: every request it accepted still gets exactly one answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.actors import instance_worker, model_manager, scheduler
from nursery.actors.directory import Directory
from nursery.backends.base import Backends
from nursery.core import Core
from nursery.errors import NurseryError
from nursery.execution import batch as batching
from nursery.messages import CloseIntake, ExecuteBatch, IndexRepository, InferWork, LoadModel
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
from nursery.scheduling.fifo import FifoPolicy
from tests.fakes import (
    ExecutionLog,
    FakeFactory,
    FakeInstance,
    fake_worker,
    make_request,
    make_work,
    write_fake_model,
)


class Injected(RuntimeError):
    """The fault a test plants."""


def _raising_at(original: Callable[..., Any], when: Callable[[], bool]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when():
            raise Injected("injected fault")
        return original(*args, **kwargs)
    return wrapper


# where a fault is planted: (object, attribute); it raises at the k-th call, whichever model
POINTS: dict[str, tuple[Any, str]] = {
    "backend.execute": (FakeInstance, "execute"),
    "batching.gather_inputs": (batching, "gather_inputs"),
    "batching.split_outputs": (batching, "split_outputs"),
    "worker.answers": (instance_worker, "_answers"),
    "policy.poll": (FifoPolicy, "poll"),
    "policy.arrive": (FifoPolicy, "arrive"),
    "policy.instance_ready": (FifoPolicy, "instance_ready"),
    "manager.load": (model_manager._Manager, "load"),
    "manager.index": (model_manager, "repository_index"),
}


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def fake_factory() -> FakeFactory:
    fake = FakeFactory()
    return fake


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(point=st.sampled_from(sorted(POINTS)), at=st.integers(0, 6),
       requests=st.integers(1, 8))
def test_a_fault_costs_its_unit_only(tmp_path_factory: pytest.TempPathFactory,
                                     fake_factory: FakeFactory, point: str, at: int,
                                     requests: int) -> None:
    repo = tmp_path_factory.mktemp("repo")
    write_fake_model(repo, "m")
    write_fake_model(repo, "ok")
    owner, attribute = POINTS[point]
    original = getattr(owner, attribute)
    calls = [0]

    def when() -> bool:
        calls[0] += 1
        return calls[0] - 1 == at

    faults = FaultCounter()
    answers: dict[str, list[Any]] = {}
    fds_before = _open_fds()

    async def infer(core: Core, model: str, i: int) -> None:
        """Every other request is sent as the gRPC fast path sends it: no task waits, the
        answer is handed to a callback where it is delivered (``ModelClient.dispatch``)."""
        request = dataclasses.replace(make_request(i), model_name=model)
        key = f"{model}:{i}"
        if i % 2:
            done = trio.Event()

            def on_answer(value: Any) -> None:
                answers.setdefault(key, []).append(value)
                done.set()

            try:
                abandon = core.client.dispatch(request, core.resolve(model), on_answer)
            except NurseryError as error:
                answers.setdefault(key, []).append(error)
                return
            assert abandon is not None
            await done.wait()
            return
        try:
            answers.setdefault(key, []).append(await core.infer(request))
        except NurseryError as error:
            answers.setdefault(key, []).append(error)

    async def command(commands: trio.MemorySendChannel[Any], make: Any) -> Any:
        send, receive = trio.open_memory_channel[Any](1)
        await commands.send(make(send))
        with receive:
            return await receive.receive()

    async def main() -> None:
        directory = Directory()
        core = Core.over(directory)
        async with trio.open_nursery() as nursery:
            commands, inbox = trio.open_memory_channel[Any](4)
            await nursery.start(partial(
                model_manager.run, repositories=(repo,), directory=directory, inbox=inbox,
                startup_models=["m", "ok"], exit_on_error=True, unload_timeout=5.0,
                faults=faults, backends=Backends({"fake": fake_factory})))
            setattr(owner, attribute, _raising_at(original, when))
            try:
                with trio.fail_after(30):  # a hang is a failure, never a stuck suite
                    async with trio.open_nursery() as clients:
                        for i in range(requests):
                            clients.start_soon(infer, core, "m", i)
                            clients.start_soon(infer, core, "ok", i)
                        clients.start_soon(command, commands,
                                           lambda reply: LoadModel("ok", reply))
                        clients.start_soon(command, commands,
                                           lambda reply: IndexRepository(False, reply))
            finally:
                setattr(owner, attribute, original)
            with trio.fail_after(30):
                # the manager still serves; "m" serves again once its supervisor reloaded it
                index = await command(commands, lambda reply: IndexRepository(False, reply))
                assert isinstance(index, list) and {e.name for e in index} == {"m", "ok"}
                # (a scheduler's fault may surface after its last answer: the restart follows)
                for name in ("m", "ok"):
                    while True:
                        try:
                            stats = await core.model_statistics(name)
                        except NurseryError:  # restarting: not available for a moment
                            await trio.sleep(0.01)
                            continue
                        assert all(snapshot.pending == 0 for _, _, snapshot in stats)
                        break
                while True:  # m serves again (a late fault's restart may still be under way)
                    answers.pop("m:1000", None)
                    await infer(core, "m", 1000)
                    if not isinstance(answers["m:1000"][0], NurseryError):
                        break
                    await trio.sleep(0.01)
            await commands.aclose()

    trio.run(main)
    for key, got in answers.items():
        assert len(got) == 1, (key, got)
    failed = sorted(k for k, got in answers.items() if isinstance(got[0], NurseryError))
    if point.startswith(("backend", "batching", "worker")):
        assert len(failed) <= 1, failed  # the one batch (of one request) that the fault hit
    elif point.startswith("policy"):
        assert len({k.split(":")[0] for k in failed}) <= 1, failed  # one model's scheduler
    else:
        assert not failed, failed  # a command's fault costs that command only
    assert len(answers) == 2 * requests + 1
    assert not isinstance(answers["m:1000"][0], NurseryError)
    assert _open_fds() <= fds_before


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(["poll", "arrive", "instance_ready"]), at=st.integers(0, 30),
       gaps=st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.02]), min_size=1, max_size=20),
       instances=st.integers(1, 3))
def test_failing_policy_still_answers_every_request(method: str, at: int, gaps: list[float],
                                                    instances: int) -> None:
    """The scheduler actor with a DynamicBatchPolicy that raises at its ``at``-th call of
    ``method``: the actor fails (its supervisor marks the version UNAVAILABLE), and every
    request it had accepted, queued in the policy or still in its inbox, has one answer."""
    config = BatchConfig(max_batch_size=4, preferred_batch_sizes=(), max_queue_delay_us=1000)
    policy = DynamicBatchPolicy[InferWork](config)
    calls = [0]

    def when() -> bool:
        calls[0] += 1
        return calls[0] - 1 == at

    setattr(policy, method, _raising_at(getattr(policy, method), when))
    got: dict[int, list[Any]] = {}
    log = ExecutionLog()

    async def wait(i: int, receive: trio.MemoryReceiveChannel[Any]) -> None:
        with receive:
            try:
                got.setdefault(i, []).append(await receive.receive())
            except trio.EndOfChannel:
                got.setdefault(i, []).append("closed")

    async def main() -> None:
        with trio.fail_after(3600):  # virtual seconds: an answer that never comes fails
            await serve()

    async def serve() -> None:
        intake, inbox = trio.open_memory_channel[Any](10_000)
        failed: list[BaseException] = []

        async def supervised(task_status: trio.TaskStatus[None]) -> None:
            try:
                await scheduler.run(name="m", policy=policy, inbox=inbox, instances=channels,
                                    task_status=task_status)
            except BaseException as exc:  # noqa: BLE001 - what the supervisor sees
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            channels = []
            for i in range(instances):
                send, receive = trio.open_memory_channel[ExecuteBatch](1)
                channels.append(send)
                await nursery.start(partial(fake_worker, i, receive, intake.clone(), log, 0.003))
            await nursery.start(supervised)
            async with trio.open_nursery() as waiters:
                for i, gap in enumerate(gaps):
                    await trio.sleep(gap)
                    work, receive = make_work(i)
                    try:
                        intake.send_nowait(work)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        got[i] = ["refused"]  # the intake is closed: refused at once
                        continue
                    waiters.start_soon(wait, i, receive)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                intake.send_nowait(CloseIntake())  # an unload: the actor finishes and ends
            intake.close()
        assert all(isinstance(e, Injected) or isinstance(e, BaseExceptionGroup)
                   for e in failed)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sorted(got) == list(range(len(gaps)))
    for i, answers in got.items():
        assert len(answers) == 1, (i, answers)
        assert answers[0] != "closed", i  # answered, not left to a closed channel
