"""The DemandLoader with the real ModelManager and a fake backend (on the real clock: loads
read files on worker threads, which a virtual clock would jump past):
concurrent requests share one load, a load slower than the timeout answers UNAVAILABLE, a
failed load is not tried again for every request, the budget unloads the least recently
used."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from nursery.actors import model_manager
from nursery.actors.demand import DemandLoader
from nursery.actors.directory import Directory, ModelState
from nursery.actors.model_client import ModelClient
from nursery.backends.base import Backends
from nursery.errors import NotFound, Unavailable
from nursery.scheduling.model_budget import Budget
from tests.fakes import FakeFactory, write_fake_model


class GatedFactory(FakeFactory):
    """A fake backend whose loads wait for ``gate`` (on the loading thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def load(self, config: Any, version_path: Path, placement: Any) -> Any:
        self.gate.wait(30)
        return super().load(config, version_path, placement)


@asynccontextmanager
async def _loader(repo: Path, factory: FakeFactory, **options: Any) -> AsyncIterator[DemandLoader]:
    directory = Directory()
    async with trio.open_nursery() as nursery:
        commands, inbox = trio.open_memory_channel[Any](4)
        await nursery.start(partial(
            model_manager.run, repositories=(repo,), directory=directory, inbox=inbox,
            backends=Backends({"fake": factory}), startup_models=[], exit_on_error=False,
            unload_timeout=5.0))
        async with commands:
            yield DemandLoader(directory, commands, ModelClient(directory), **options)


async def _until(predicate: Any) -> None:
    with trio.fail_after(60):
        while not predicate():  # noqa: ASYNC110 - state published by another actor
            await trio.sleep(0.05)


def _ready(loader: DemandLoader, name: str) -> bool:
    entry = loader.directory.entry(name)
    return entry is not None and any(s.state is ModelState.READY
                                     for s in entry.versions.values())


async def test_concurrent_requests_share_one_load(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "m")
    factory = FakeFactory()
    async with _loader(tmp_path, factory, on_demand=True) as loader:
        handles = []

        async def one() -> None:
            handles.append(await loader.acquire("m"))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
        assert len(handles) == 10 and len({id(h) for h in handles}) == 1
        assert len(factory.instances) == 1
        assert loader.demand_loads["m"] == 1
        # an unknown model keeps the directory's answer, and the second ask is not a load
        for _ in range(2):
            with pytest.raises(NotFound):
                await loader.acquire("nothing")


async def test_a_load_slower_than_the_timeout_answers_unavailable(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "m")
    factory = GatedFactory()
    factory.gate.clear()
    async with _loader(tmp_path, factory, on_demand=True, timeout=0.5) as loader:
        with pytest.raises(Unavailable, match="did not load within 0.5 s"):
            await loader.acquire("m")
        factory.gate.set()
        await _until(lambda: _ready(loader, "m"))
        assert (await loader.acquire("m")).name == "m"


async def test_without_the_flag_nothing_is_loaded(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "m")
    async with _loader(tmp_path, FakeFactory()) as loader:
        with pytest.raises(NotFound):
            await loader.acquire("m")
        assert not _ready(loader, "m")


async def test_a_failed_load_is_not_retried_for_every_request(tmp_path: Path) -> None:
    write_fake_model(tmp_path, "m")
    factory = FakeFactory()
    factory.fail_load = "no such luck"
    async with _loader(tmp_path, factory, on_demand=True, retry_after=0.5) as loader:
        for _ in range(3):
            with pytest.raises(Exception, match="no such luck"):
                await loader.acquire("m")
        assert len(factory.load_threads) == 1  # one load tried, the others answered from it
        factory.fail_load = None
        await trio.sleep(0.6)  # past retry_after
        assert (await loader.acquire("m")).name == "m"


async def test_budget_unloads_the_least_recently_used(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        write_fake_model(tmp_path, name)
    async with _loader(tmp_path, FakeFactory(), on_demand=True,
                       budget=Budget(models=2)) as loader:
        await loader.acquire("a")
        await loader.acquire("b")
        await loader.acquire("a")
        await loader.acquire("c")
        await _until(lambda: not _ready(loader, "b"))
        assert _ready(loader, "a") and _ready(loader, "c")
        assert dict(loader.evictions) == {"b": 1}
