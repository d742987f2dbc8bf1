"""--model-namespacing: the ModelManager (and the RepositoryPoller) with two repositories that
hold models of the same name, on fake backends (Triton's qa/L0_model_namespacing, as actors)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from nursery import messages
from nursery.actors import model_manager, repository_poller
from nursery.actors.directory import Directory, ModelState
from nursery.backends.base import Backends
from nursery.core import Core
from nursery.errors import InvalidArgument, NurseryError
from tests.fakes import FAKE_CONFIG, FakeFactory, FakeInstance, make_request, write_fake_model

AMBIGUOUS = ("There are 2 identifiers of model 'm' in global map, model namespace must be "
             "provided to resolve ambiguity.")


class _TripleInstance(FakeInstance):
    def execute(self, inputs: Any, output_names: Any) -> dict[str, np.ndarray]:
        return {"OUTPUT0": super().execute(inputs, output_names)["OUTPUT0"] * 1.5}


class TripleFactory(FakeFactory):
    """A fake backend whose instances answer INPUT0 * 3 (the fake one's answer twice)."""

    name = "triple"

    def load(self, config: Any, version_path: Path, placement: Any) -> FakeInstance:
        instance = _TripleInstance(self, placement)
        self.instances.append(instance)
        return instance


def _ensemble(step: str) -> str:
    return ('platform: "ensemble"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
            'input_map { key: "INPUT0" value: "INPUT0" } '
            'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n')


def _repositories(tmp_path: Path) -> tuple[Path, Path]:
    """Two repositories: ``a`` holds m (doubles) and the ensemble e over m; ``b`` holds m
    (triples) and the ensemble f over m."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_fake_model(a, "m")
    write_fake_model(a, "e", _ensemble("m"))
    write_fake_model(b, "m", FAKE_CONFIG.replace('backend: "fake"', 'backend: "triple"'))
    write_fake_model(b, "f", _ensemble("m"))
    return a, b


class Harness:
    def __init__(self, directory: Directory, commands: trio.MemorySendChannel[Any],
                 failed: list[str]) -> None:
        self.directory = directory
        self.core = Core.over(directory, commands)
        self.commands = commands
        self.failed = failed

    async def command(self, make: Callable[..., Any], name: str, **kw: Any) -> Any:
        send, receive = trio.open_memory_channel[Any](1)
        await self.commands.send(make(name, send, **kw))
        return await receive.receive()

    async def answer(self, name: str) -> float:
        """What ``name`` answers for an input of 1: 2 from a's m, 3 from b's."""
        request = make_request(1)
        request.model_name = name
        response = await self.core.infer(request)
        return float(response.outputs[0].data[0, 0])

    async def index(self) -> list[tuple[str, str | None]]:
        return [(e.name, e.state) for e in await self.core.repository_index()]


@asynccontextmanager
async def _manager(repositories: tuple[Path, ...], models: list[str], *,
                   namespacing: bool = True, poll: float = 0.0) -> AsyncIterator[Harness]:
    directory = Directory()
    async with trio.open_nursery() as nursery:
        commands, inbox = trio.open_memory_channel[Any](4)
        failed = await nursery.start(partial(
            model_manager.run, repositories=repositories, directory=directory, inbox=inbox,
            backends=Backends({"fake": FakeFactory(), "triple": TripleFactory()}),
            startup_models=models, exit_on_error=False, namespacing=namespacing))
        async with commands:
            if poll:
                await nursery.start(partial(
                    repository_poller.run, repositories=repositories,
                    manager=commands.clone(), interval=poll, namespacing=namespacing))
            yield Harness(directory, commands, failed)
            nursery.cancel_scope.cancel()


async def _until(check: Callable[[], Any]) -> None:
    """Wait (bounded) until ``check()`` answers without raising and truthy."""
    with trio.fail_after(10):
        while True:
            try:
                if await check():
                    return
            except (NurseryError, AssertionError):
                pass
            await trio.sleep(0.02)


async def test_a_name_in_two_repositories_loads_twice_and_only_ensembles_tell_them_apart(
        tmp_path: Path) -> None:
    """Both m load, each in its repository's namespace; each ensemble's step takes the m of
    its own repository; a request for m itself is refused as ambiguous (INVALID_ARG, Triton's
    words), as are its readiness, metadata and statistics; the index lists each m."""
    a, b = _repositories(tmp_path)
    async with _manager((a, b), ["e", "f", "m"]) as h:
        assert h.failed == []
        assert await h.answer("e") == 2
        assert await h.answer("f") == 3
        with pytest.raises(InvalidArgument) as caught:
            await h.answer("m")
        assert caught.value.message == AMBIGUOUS
        assert not await h.core.model_ready("m")
        with pytest.raises(InvalidArgument, match="ambiguity"):
            h.core.model_metadata("m")
        with pytest.raises(InvalidArgument, match="ambiguity"):
            await h.core.model_statistics("m")
        assert await h.index() == [("e", "READY"), ("m", "READY"), ("f", "READY"),
                                   ("m", "READY")]
        keys = set(h.directory.table.models)
        assert {f"{a}::m", f"{b}::m", f"{a}::e", f"{b}::f"} == keys
        with pytest.raises(InvalidArgument, match="Request for unknown model: 'nope' is not"):
            await h.answer("nope")


async def test_a_step_takes_the_only_model_of_its_name_when_its_own_is_gone(
        tmp_path: Path) -> None:
    """Unloading a's m (as the poller does when its folder goes) leaves b's the only m: e's
    step and requests for m go to it; loading a's m again gives e its own step back, and m
    is ambiguous again. An unload by name takes every namespace's model."""
    a, b = _repositories(tmp_path)
    async with _manager((a, b), ["e", "f"]) as h:
        assert await h.command(messages.UnloadModel, "m", namespace=str(a)) is None
        assert await h.answer("e") == 3
        assert await h.answer("m") == 3
        assert await h.command(messages.LoadModel, "m", namespace=str(a)) is None
        assert await h.answer("e") == 2
        with pytest.raises(InvalidArgument, match="ambiguity"):
            await h.answer("m")
        assert await h.command(messages.UnloadModel, "m") is None
        for ns in (a, b):
            entry = h.directory.table.models[f"{ns}::m"]
            assert entry.versions[1].state is ModelState.UNAVAILABLE
        with pytest.raises(InvalidArgument, match="Request for unknown model: 'm' is not"):
            await h.answer("m")


async def test_an_explicit_load_of_an_unchanged_ensemble_loads_its_new_own_step(
        tmp_path: Path) -> None:
    """L0_model_namespacing's explicit dynamic_resolution: with a's m away, loading e loads
    b's m for its step; once a's m is back, loading e again (its folder unchanged) loads a's
    m with it (Triton polls an ensemble's models with it), and e takes its own m again."""
    a, b = _repositories(tmp_path)
    shutil.move(a / "m", tmp_path / "m")
    async with _manager((a, b), []) as h:
        for name in ("e", "f"):
            assert await h.command(messages.LoadModel, name) is None
        assert (await h.answer("e"), await h.answer("f"), await h.answer("m")) == (3, 3, 3)
        shutil.move(tmp_path / "m", a / "m")
        assert await h.command(messages.LoadModel, "e") is None
        assert (await h.answer("e"), await h.answer("f")) == (2, 3)
        with pytest.raises(InvalidArgument, match="ambiguity"):
            await h.answer("m")


async def test_a_step_held_only_by_two_other_repositories_is_ambiguous(tmp_path: Path) -> None:
    """An ensemble of a third repository whose step names a model that two other
    repositories hold cannot choose: Triton's "not available or ambiguous", naming the
    ensemble by its identifier; the other models serve on."""
    a, b = _repositories(tmp_path)
    c = tmp_path / "c"
    write_fake_model(c, "g", _ensemble("m"))
    async with _manager((a, b, c), ["e", "f", "g"]) as h:
        assert h.failed == ["g"]
        error = await h.command(messages.LoadModel, "g")
        assert error is not None
        assert (f"ensemble {c}::g contains models that are not available or ambiguous: m"
                in error.message), error.message
        assert (await h.answer("e"), await h.answer("f")) == (2, 3)


async def test_without_namespacing_a_name_in_two_repositories_is_refused(
        tmp_path: Path) -> None:
    """Namespacing off (the default) keeps Triton's refusal of a duplicate name."""
    a, b = _repositories(tmp_path)
    async with _manager((a, b), ["m"], namespacing=False) as h:
        assert h.failed == ["m"]
        assert await h.index() == [("e", None), ("f", None), ("m", "UNAVAILABLE")]


async def test_unloading_a_step_s_model_unloads_the_ensembles_that_use_it(
        tmp_path: Path) -> None:
    """L0_lifecycle's model control: unloading the model an ensemble is made of unloads the
    ensemble too (Triton's dependency graph finds it not valid); the model's return brings
    the ensemble back, unless the ensemble was unloaded by name meanwhile."""
    a = tmp_path / "a"
    write_fake_model(a, "m")
    write_fake_model(a, "e", _ensemble("m"))
    async with _manager((a,), ["e"], namespacing=False) as h:
        assert await h.answer("e") == 2
        assert await h.command(messages.UnloadModel, "m") is None
        assert ("e", "UNAVAILABLE") in await h.index()
        with pytest.raises(NurseryError):
            await h.answer("e")
        assert await h.command(messages.LoadModel, "m") is None
        assert await h.answer("e") == 2  # back with its step
        assert await h.command(messages.UnloadModel, "m") is None
        assert await h.command(messages.UnloadModel, "e") is None  # by name: it stays out
        assert await h.command(messages.LoadModel, "m") is None
        assert await h.answer("m") == 2
        assert ("e", "UNAVAILABLE") in await h.index()


async def test_without_namespacing_the_poller_unloads_a_name_that_becomes_a_duplicate(
        tmp_path: Path) -> None:
    """Poll mode without namespacing (L0_lifecycle's multiple-repository polling): a served m
    copied into the second repository is unloaded (Triton serves neither copy), and loaded
    from the second once the first copy is gone."""
    a, b = _repositories(tmp_path)
    shutil.move(b / "m", tmp_path / "b_m")
    async with _manager((a, b), ["m"], namespacing=False, poll=0.05) as h:
        assert await h.answer("m") == 2
        shutil.move(tmp_path / "b_m", b / "m")

        async def unloaded() -> bool:
            try:
                await h.answer("m")
            except NurseryError:
                return ("m", "UNAVAILABLE") in await h.index()
            return False

        await _until(unloaded)
        shutil.rmtree(a / "m")

        async def from_b() -> bool:
            return await h.answer("m") == 3

        await _until(from_b)


async def test_the_poller_loads_and_unloads_each_namespace_on_its_own(tmp_path: Path) -> None:
    """Poll mode (L0_model_namespacing's poll dynamic_resolution): a's m leaving its
    repository unloads only a's m, and e's step then takes b's; its return loads a's m
    again, and e takes its own."""
    a, b = _repositories(tmp_path)
    async with _manager((a, b), ["e", "f", "m"], poll=0.05) as h:
        shutil.move(a / "m", tmp_path / "m")

        async def only_b() -> bool:
            return await h.answer("m") == 3 and await h.answer("e") == 3

        await _until(only_b)
        assert h.directory.table.models[f"{b}::m"].versions[1].state is ModelState.READY
        shutil.move(tmp_path / "m", a / "m")

        async def both() -> bool:
            return await h.answer("e") == 2 and h.directory.table.models[
                f"{a}::m"].versions[1].state is ModelState.READY

        await _until(both)
        assert await h.answer("f") == 3
        with pytest.raises(InvalidArgument, match="ambiguity"):
            await h.answer("m")
