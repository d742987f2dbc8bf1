"""The ModelManager and InstanceWorkers with a fake backend: lifecycle, threads, draining."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from nursery import errors, messages
from nursery.actors import model_manager, rate_limiter
from nursery.actors.directory import Directory, ModelState
from nursery.actors.rate_limiter import RateLimiterClient
from nursery.backends.base import Backends
from nursery.config.json_form import config_from_json
from nursery.core import Core
from nursery.errors import InternalError, NotFound, Unavailable
from nursery.scheduling.rate_limit_policy import RateLimitPolicy
from tests.fakes import FAKE_CONFIG, FakeFactory, make_request, write_fake_model


@pytest.fixture
def factory() -> FakeFactory:
    fake = FakeFactory()
    return fake


class Harness:
    def __init__(self, directory: Directory, commands: trio.MemorySendChannel[Any],
                 failed: list[str]) -> None:
        self.directory = directory
        self.core = Core.over(directory)
        self.commands = commands
        self.failed = failed

    def state(self, name: str, version: int = 1) -> tuple[ModelState, str]:
        entry = self.directory.entry(name)
        assert entry is not None
        status = entry.versions[version]
        return status.state, status.reason

    async def command(self, cls: type, name: str) -> Any:
        send, receive = trio.open_memory_channel[Any](1)
        await self.commands.send(cls(name, send))
        return await receive.receive()


@asynccontextmanager
async def _manager(repo: Path, factory: FakeFactory, models: list[str], exit_on_error: bool = False,
                   unload_timeout: float = 5.0,
                   rate_limiter: RateLimiterClient | None = None) -> AsyncIterator[Harness]:
    directory = Directory()
    async with trio.open_nursery() as nursery:
        commands, inbox = trio.open_memory_channel[Any](4)
        failed = await nursery.start(partial(
            model_manager.run, repositories=(repo,), directory=directory, inbox=inbox,
            backends=Backends({"fake": factory}),
            startup_models=models, exit_on_error=exit_on_error, unload_timeout=unload_timeout,
            rate_limiter=rate_limiter))
        async with commands:
            yield Harness(directory, commands, failed)


async def test_load_serve_unload(tmp_path: Path, factory: FakeFactory) -> None:
    write_fake_model(tmp_path, "m", FAKE_CONFIG + "instance_group [{ count: 3 kind: KIND_CPU }]")
    async with _manager(tmp_path, factory, ["m"]) as h:
        assert h.failed == []
        assert h.state("m") == (ModelState.READY, "")
        assert len(factory.instances) == 3
        async with trio.open_nursery() as clients:
            results = {}

            async def one(i: int) -> None:
                results[i] = await h.core.infer(make_request(i, rows=2))

            for i in range(30):
                clients.start_soon(one, i)
        for i, response in results.items():
            np.testing.assert_array_equal(response.outputs[0].data, np.full((2, 2), 2 * i))
        # every instance only ever ran on its own thread, the one it was loaded on
        for instance in factory.instances:
            assert len(instance.threads) == 1
            assert threading.get_ident() not in instance.threads
        assert {i for i, _ in factory.executions} == {0, 1, 2}
        assert await h.command(messages.UnloadModel, "m") is None
        assert h.state("m") == (ModelState.UNAVAILABLE, "unloaded")
        assert sorted(factory.closed) == [0, 1, 2]
        with pytest.raises(NotFound, match="has no available versions"):
            await h.core.infer(make_request(1))


async def test_small_batches_of_an_inline_safe_backend_run_on_the_trio_thread(
        tmp_path: Path, factory: FakeFactory) -> None:
    """InlinePolicy: once batches are measured to take less than a thread hand-off, an
    ``inline_safe`` backend computes on the trio thread, with a threaded probe now and then;
    every answer is right either way. A slow model stays on its thread."""
    write_fake_model(tmp_path, "m")
    factory.inline_safe = True
    async with _manager(tmp_path, factory, ["m"]) as h:
        for i in range(200):
            response = await h.core.infer(make_request(i))
            np.testing.assert_array_equal(response.outputs[0].data, np.full((1, 2), 2 * i))
        (instance,) = factory.instances
        assert threading.get_ident() in instance.threads  # inline
        assert len(instance.threads) == 2  # and its own thread: the first batches and probes
        stats = await h.core.model_statistics("m")
        assert stats[0][2].success.count == 200
    slow = FakeFactory()
    slow.inline_safe, slow.compute = True, 0.002
    async with _manager(tmp_path, slow, ["m"]) as h:
        for i in range(20):
            await h.core.infer(make_request(i))
        assert threading.get_ident() not in slow.instances[0].threads


async def test_failed_load_reports_reason(tmp_path: Path, factory: FakeFactory) -> None:
    write_fake_model(tmp_path, "good", FAKE_CONFIG.replace("fake", "fake"))
    bad = write_fake_model(tmp_path, "bad")
    (bad / "config.pbtxt").write_text("max_batch_size: [")
    factory.fail_load = None
    async with _manager(tmp_path, factory, ["bad", "good"]) as h:
        assert h.failed == ["bad"]
        entry = h.directory.entry("bad")
        assert entry is not None and "Invalid argument: model 'bad': config.pbtxt:1:17" in entry.reason
        assert h.state("good")[0] is ModelState.READY
        # as Triton's: a model whose configuration could not be read is left out, not
        # counted by strict readiness and not found by requests
        assert h.directory.all_ready()
        with pytest.raises(NotFound, match="Request for unknown model: 'bad' is not found"):
            await h.core.infer(dataclasses.replace(make_request(1), model_name="bad"))


async def test_a_model_with_no_version_to_serve_keeps_the_server_unready(
        tmp_path: Path, factory: FakeFactory) -> None:
    """A readable configuration that selects no version is a failed load in Triton (its poll
    takes the model in): strict readiness counts it."""
    folder = write_fake_model(tmp_path, "empty")
    (folder / "1" / "model.fake").unlink()
    (folder / "1").rmdir()
    async with _manager(tmp_path, factory, ["empty"]) as h:
        assert h.failed == ["empty"]
        assert not h.directory.all_ready()


async def test_backend_load_failure_marks_version_unavailable(tmp_path: Path,
                                                              factory: FakeFactory) -> None:
    write_fake_model(tmp_path, "m")
    factory.fail_load = "weights are corrupt"
    async with _manager(tmp_path, factory, ["m"]) as h:
        assert h.state("m") == (ModelState.UNAVAILABLE, "Internal: weights are corrupt")


async def test_exit_on_error_raises(tmp_path: Path, factory: FakeFactory) -> None:
    write_fake_model(tmp_path, "m")
    factory.fail_load = "nope"
    with pytest.raises(BaseException) as err:  # noqa: PT011 - trio wraps it in a group
        async with _manager(tmp_path, factory, ["m"], exit_on_error=True):
            pass
    assert isinstance(errors.first_error(err.value), errors.StartupError)


async def test_execute_error_answers_requests_and_keeps_serving(
    tmp_path: Path, factory: FakeFactory
) -> None:
    write_fake_model(tmp_path, "m")
    async with _manager(tmp_path, factory, ["m"]) as h:
        factory.fail_execute = True
        with pytest.raises(InternalError, match="backend exploded"):
            await h.core.infer(make_request(1))
        factory.fail_execute = False
        response = await h.core.infer(make_request(2))
        assert response.outputs[0].data[0, 0] == 4


async def test_unload_drains_accepted_requests(tmp_path: Path, factory: FakeFactory) -> None:
    write_fake_model(tmp_path, "m")
    factory.compute = 0.05
    async with _manager(tmp_path, factory, ["m"]) as h:
        results: list[Any] = []

        async def one(i: int) -> None:
            try:
                results.append(await h.core.infer(make_request(i)))
            except Unavailable as exc:
                results.append(exc)

        async with trio.open_nursery() as clients:
            for i in range(5):
                clients.start_soon(one, i)
            await trio.sleep(0.01)  # all five are queued or running
            assert await h.command(messages.UnloadModel, "m") is None
        assert len(results) == 5 and all(not isinstance(r, Exception) for r in results)
        assert len(factory.executions) == 5


async def test_reload_failure_keeps_old_version(tmp_path: Path, factory: FakeFactory) -> None:
    folder = write_fake_model(tmp_path, "m")
    async with _manager(tmp_path, factory, ["m"]) as h:
        factory.fail_load = "broken new weights"
        (folder / "1" / "model.fake").write_text("new weights")  # changed: a reload is due
        error = await h.command(messages.LoadModel, "m")
        assert error is not None and "broken new weights" in error.message
        assert h.state("m") == (ModelState.READY, "")
        factory.fail_load = None
        assert (await h.core.infer(make_request(3))).outputs[0].data[0, 0] == 6


async def test_an_unload_waits_for_the_load_in_progress(tmp_path: Path,
                                                      factory: FakeFactory) -> None:
    """L0_lifecycle's concurrent load and unload: the unload waits for the load to finish
    (both succeed, the model ends unloaded), as in Triton; only past the unload timeout
    would it stop the load."""
    write_fake_model(tmp_path, "m")
    factory.load_delay = 0.5
    async with _manager(tmp_path, factory, []) as h:
        results: dict[str, Any] = {}

        async def run(kind: str, make: Any) -> None:
            results[kind] = await h.command(make, "m")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "load", messages.LoadModel)
            await trio.sleep(0.1)
            nursery.start_soon(run, "unload", messages.UnloadModel)
        assert results == {"load": None, "unload": None}
        assert h.state("m")[0] is ModelState.UNAVAILABLE


async def test_an_unload_of_a_step_waits_for_the_ensemble_loading_it(
        tmp_path: Path, factory: FakeFactory) -> None:
    """L0_lifecycle's concurrent load and unload, second part: an ensemble's load loads its
    step's model; an unload of that model meanwhile waits for the ensemble's load, then
    unloads the model and with it the ensemble, which it has left not valid."""
    write_fake_model(tmp_path, "m")
    write_fake_model(tmp_path, "e", (
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "m" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } '
        'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n'))
    factory.load_delay = 0.5
    async with _manager(tmp_path, factory, []) as h:
        results: dict[str, Any] = {}

        async def run(kind: str, make: Any, name: str) -> None:
            results[kind] = await h.command(make, name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "load", messages.LoadModel, "e")
            await trio.sleep(0.1)
            nursery.start_soon(run, "unload", messages.UnloadModel, "m")
        assert results == {"load": None, "unload": None}
        assert h.state("m")[0] is ModelState.UNAVAILABLE
        assert h.state("e")[0] is ModelState.UNAVAILABLE


async def test_a_config_override_is_kept_until_the_folder_s_own_is_newer(
        tmp_path: Path, factory: FakeFactory) -> None:
    """L0_lifecycle's config overwrite: a load without a configuration keeps the one a load
    request gave, until the folder's config.pbtxt is newer than it (Triton's rule)."""
    folder = write_fake_model(tmp_path, "m")
    async with _manager(tmp_path, factory, ["m"]) as h:
        def max_batch() -> int:
            entry = h.directory.table.models["m"]
            assert entry.config is not None
            return entry.config.max_batch_size

        assert max_batch() == 8
        send, receive = trio.open_memory_channel[Any](1)
        override = config_from_json(
            '{"backend": "fake", "max_batch_size": 4, "input": [{"name": "INPUT0", '
            '"data_type": "TYPE_FP32", "dims": [2]}], "output": [{"name": "OUTPUT0", '
            '"data_type": "TYPE_FP32", "dims": [2]}]}')
        await h.commands.send(messages.LoadModel("m", send, config=override))
        assert await receive.receive() is None
        assert max_batch() == 4
        assert await h.command(messages.LoadModel, "m") is None
        assert max_batch() == 4  # kept
        await trio.sleep(0.01)
        (folder / "config.pbtxt").touch()
        assert await h.command(messages.LoadModel, "m") is None
        assert max_batch() == 8  # the folder's, newer


async def test_a_new_empty_version_folder_is_a_change(tmp_path: Path,
                                                    factory: FakeFactory) -> None:
    """L0_lifecycle's reload of its identity model: a version folder made empty (the backend
    needs no file in it) is a change, so the load serves it and the old version goes."""
    folder = write_fake_model(tmp_path, "m")
    async with _manager(tmp_path, factory, ["m"]) as h:
        (folder / "2").mkdir()
        assert await h.command(messages.LoadModel, "m") is None
        assert h.state("m", 2) == (ModelState.READY, "")
        assert h.state("m", 1)[0] is ModelState.UNAVAILABLE


async def test_an_instance_update_refused_by_the_rate_limiter_leaves_nothing_running(
        tmp_path: Path, factory: FakeFactory) -> None:
    """An added instance whose resources the pools cannot hold is refused before it starts;
    the version serves on, unloads, and the manager returns (the refused worker once kept
    the scheduler's inbox open, so the shutdown waited forever)."""
    def needing(count: int) -> str:
        return FAKE_CONFIG + ('instance_group [{ count: 1 kind: KIND_CPU rate_limiter { '
                              f'resources [{{ name: "R1" count: {count} }}] }} }}]')

    folder = write_fake_model(tmp_path, "m", needing(2))
    limits_send, limits_inbox = trio.open_memory_channel[Any](math.inf)
    with trio.fail_after(10):  # the unload's own deadline is longer: it must not be needed
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(rate_limiter.run,
                                        policy=RateLimitPolicy({("R1", None): 10}),
                                        inbox=limits_inbox))
            async with _manager(tmp_path, factory, ["m"], unload_timeout=60,
                                rate_limiter=RateLimiterClient(limits_send)) as h:
                (folder / "config.pbtxt").write_text(needing(32))
                error = await h.command(messages.LoadModel, "m")
                assert error is not None and "limited to 10" in error.message
                assert (await h.core.infer(make_request(3))).outputs[0].data[0, 0] == 6
                (folder / "config.pbtxt").write_text(needing(8))
                assert await h.command(messages.LoadModel, "m") is None
                assert (await h.core.infer(make_request(4))).outputs[0].data[0, 0] == 8
                assert await h.command(messages.UnloadModel, "m") is None
            limits_send.close()


async def test_a_load_is_all_or_nothing_across_versions(tmp_path: Path,
                                                       factory: FakeFactory) -> None:
    """As Triton's: when one version of a model fails to load, the versions that load brought
    up are unloaded again, so the model has no available version; a version that served
    before the load (a reload) keeps serving."""
    folder = write_fake_model(tmp_path, "m", FAKE_CONFIG + "version_policy: { all { } }",
                              versions=(1, 3))
    factory.fail_versions = {"3"}
    async with _manager(tmp_path, factory, ["m"]) as h:
        assert h.failed == ["m"]
        assert h.state("m", 1) == (ModelState.UNAVAILABLE, "unloaded")
        assert h.state("m", 3)[0] is ModelState.UNAVAILABLE
        with pytest.raises(NotFound, match="has no available versions"):
            await h.core.infer(make_request(1))
        factory.fail_versions = set()
        assert await h.command(messages.LoadModel, "m") is None
        assert h.state("m", 1)[0] is ModelState.READY
        factory.fail_versions = {"3"}
        (folder / "3" / "model.fake").write_text("changed")  # version 3 reloads, and fails
        error = await h.command(messages.LoadModel, "m")
        assert error is not None and "version 3 is broken" in error.message
        assert h.state("m", 1)[0] is ModelState.READY  # it served before: it stays
        assert (await h.core.infer(make_request(2))).outputs[0].data[0, 0] == 4


def _ensemble(steps: list[str]) -> str:
    """An ensemble over fake-model-shaped steps, run one after another."""
    tensors = ["INPUT0", *(f"T{i}" for i in range(len(steps) - 1)), "OUTPUT0"]
    body = ", ".join(
        f'{{ model_name: "{model}" model_version: -1 '
        f'input_map {{ key: "INPUT0" value: "{tensors[i]}" }} '
        f'output_map {{ key: "OUTPUT0" value: "{tensors[i + 1]}" }} }}'
        for i, model in enumerate(steps))
    return ('platform: "ensemble"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            f"ensemble_scheduling {{ step [ {body} ] }}\n")


async def test_ensemble_steps_missing_or_without_their_version_use_tritons_words(
        tmp_path: Path, factory: FakeFactory) -> None:
    """Triton's dependency graph: step models that no repository holds are named together
    (sorted) before anything loads; a step asking for a version its model does not serve
    names that version (L0_model_config's non_existing_model and no_required_version). The
    two ensembles loading at start-up share one load of 'm' (two loads of it at once left one
    version running unowned, and shutdown waited for it for ever)."""
    write_fake_model(tmp_path, "m", FAKE_CONFIG + "version_policy: { all {} }")
    write_fake_model(tmp_path, "missing", _ensemble(["m", "zeta", "alpha", "m"]))
    pinned = _ensemble(["m", "m"]).replace("model_version: -1", "model_version: 2", 1)
    write_fake_model(tmp_path, "pinned", pinned)
    write_fake_model(tmp_path, "pinned_later", _ensemble(["m", "m"])[::-1].replace(
        "1- :noisrev_ledom", "2 :noisrev_ledom", 1)[::-1])
    async with _manager(tmp_path, factory, ["missing", "pinned", "pinned_later"]) as h:
        assert h.failed == ["missing", "pinned", "pinned_later"]
        error = await h.command(messages.LoadModel, "missing")
        assert error is not None
        assert ("ensemble missing contains models that are not available or ambiguous: "
                "alpha, zeta") in error.message
        for name in ("pinned", "pinned_later"):
            error = await h.command(messages.LoadModel, name)
            assert error is not None
            assert (f"ensemble '{name}' depends on 'm' whose required version 2 is not "
                    "loaded.") in error.message, error.message
        assert h.state("m") == (ModelState.READY, "")  # loaded with them, version 1 serves


async def test_nested_ensembles_load_and_only_real_cycles_are_refused(
        tmp_path: Path, factory: FakeFactory) -> None:
    """An ensemble step may be an ensemble (Triton's L0_decoupled nested_square): loaded
    together at start-up, in any order, the outer one waits for the inner one instead of
    seeing a circular dependency; two ensembles that use each other are refused, loaded
    together or alone, and the loads end."""
    write_fake_model(tmp_path, "m")
    write_fake_model(tmp_path, "inner", _ensemble(["m", "m"]))
    write_fake_model(tmp_path, "outer", _ensemble(["inner", "m"]))
    write_fake_model(tmp_path, "outer2", _ensemble(["inner"]))
    write_fake_model(tmp_path, "c1", _ensemble(["c2"]))
    write_fake_model(tmp_path, "c2", _ensemble(["c1"]))
    write_fake_model(tmp_path, "self", _ensemble(["self"]))
    async with _manager(tmp_path, factory,
                        ["outer", "outer2", "inner", "m", "c1", "c2"]) as h:
        assert h.failed == ["c1", "c2"]
        for name, factor in (("outer", 8), ("outer2", 4), ("inner", 4)):
            request = make_request(3)
            request.model_name = name
            response = await h.core.infer(request)
            assert response.outputs[0].data[0, 0] == 3 * factor
            # Triton sets an ensemble's transaction policy, so its configuration carries it
            served = h.directory.resolve(name, "").config
            assert served.json["model_transaction_policy"] == {"decoupled": False}
        for name, cycles in (("c1", ("c1 -> ... -> c2 -> c1", "c2 -> ... -> c1 -> c2")),
                             ("self", ("self -> ... -> self -> self",))):
            error = await h.command(messages.LoadModel, name)
            # Triton's words: the ensemble that found the cycle, then the one using it on the
            # way back (whichever of the two reaches its check last finds it)
            assert error is not None and any(
                f"circular dependency between ensembles: {cycle}" in error.message
                for cycle in cycles), error.message
        # the inner ensemble, not yet loaded, is loaded with the outer one
        assert await h.command(messages.UnloadModel, "inner") is None
        assert await h.command(messages.UnloadModel, "outer2") is None
        assert await h.command(messages.LoadModel, "outer2") is None
        assert h.state("inner") == (ModelState.READY, "")


async def test_the_overrides_folder_is_made_only_when_used_and_removed_at_exit(
    tmp_path: Path, factory: FakeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager makes its temporary folder for 'file:' overrides on the first load that
    writes one, and removes it when it stops; a start-up that fails leaves none either."""
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    repo = tmp_path / "repo"
    write_fake_model(repo, "m")
    async with _manager(repo, factory, ["m"]) as h:
        assert list(temp.iterdir()) == []  # nothing made for a manager that writes nothing
        send, receive = trio.open_memory_channel[Any](1)
        override = config_from_json(
            '{"backend": "fake", "max_batch_size": 4, "input": [{"name": "INPUT0", '
            '"data_type": "TYPE_FP32", "dims": [2]}], "output": [{"name": "OUTPUT0", '
            '"data_type": "TYPE_FP32", "dims": [2]}]}')
        await h.commands.send(messages.LoadModel("m2", send, config=override,
                                                 files={"1/weights.bin": b"w"}))
        assert await receive.receive() is None
        assert [p.name[:18] for p in temp.iterdir()] == ["nursery-overrides-"]
    assert list(temp.iterdir()) == []
    factory.fail_load = "nope"
    with pytest.raises(BaseException) as err:  # noqa: PT011 - trio wraps it in a group
        async with _manager(repo, factory, ["m"], exit_on_error=True):
            pass
    assert isinstance(errors.first_error(err.value), errors.StartupError)
    assert list(temp.iterdir()) == []
