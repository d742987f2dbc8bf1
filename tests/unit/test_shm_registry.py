"""The shared-memory registry against real POSIX shared memory: a request can only ever see
the bytes of its own region, whatever offsets and sizes it asks for."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.errors import AlreadyExists, InternalError, InvalidArgument, NotFound
from nursery.shm import SharedMemoryRegistry

SIZE = 8192
REGION_OFFSET = 4096 + 100  # not page aligned: the registry maps from the page below
REGION_SIZE = 1000


@pytest.fixture(scope="module")
def key() -> Iterator[str]:
    name = f"/nursery_unit_{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{name[1:]}"
    with open(path, "wb") as f:
        f.write(bytes(i % 251 for i in range(SIZE)))
    yield name
    os.unlink(path)


@pytest.fixture(scope="module")
def registry(key: str) -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry()
    reg.register_system("r", key, REGION_OFFSET, REGION_SIZE)
    yield reg
    reg.close()


@settings(max_examples=60, deadline=None)
@given(offset=st.integers(-5, REGION_SIZE + 5), size=st.integers(-5, REGION_SIZE + 5))
def test_reads_stay_inside_the_region(registry: SharedMemoryRegistry, offset: int,
                                      size: int) -> None:
    inside = 0 <= offset < REGION_SIZE and 0 <= size and offset + size <= REGION_SIZE
    if not inside:
        with pytest.raises(InvalidArgument, match="Invalid offset"):
            registry.read("r", offset, size)
        return
    start = REGION_OFFSET + offset
    assert bytes(registry.read("r", offset, size)) == bytes(
        i % 251 for i in range(start, start + size))


def test_write_then_read(registry: SharedMemoryRegistry) -> None:
    registry.write("r", 10, 8, b"abcd", "OUT")
    assert bytes(registry.read("r", 10, 4)) == b"abcd"
    with pytest.raises(InternalError, match=r"\(2 bytes\) should be at least 4 bytes"):
        registry.write("r", 10, 2, b"abcd", "OUT")


def test_registration_errors(registry: SharedMemoryRegistry, key: str) -> None:
    with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
        registry.register_system("r", key, 0, 8)
    with pytest.raises(InvalidArgument, match="failed to register shared memory region 'big'"):
        registry.register_system("big", key, SIZE - 4, 8)
    with pytest.raises(InternalError, match="Unable to open shared memory region"):
        registry.register_system("x", "/a/b", 0, 8)
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'zzz'"):
        registry.read("zzz", 0, 1)
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'zzz'"):
        registry.status("zzz")
    registry.register_system("second", key, 0, 16)
    assert {r["name"] for r in registry.status()} == {"r", "second"}
    view = registry.read("second", 0, 16)  # a request still holds a view of it
    registry.unregister("second")
    assert bytes(view[:2]) == bytes([0, 1])  # still readable: the mapping outlives the view
    registry.unregister("second")  # twice is fine, as in Triton
    assert [r["name"] for r in registry.status()] == ["r"]
