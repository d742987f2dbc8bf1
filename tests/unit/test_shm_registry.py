"""The shared-memory registry against real POSIX shared memory: a request can only ever see
the bytes of its own region, whatever offsets and sizes it asks for."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.errors import AlreadyExists, InternalError, InvalidArgument, NotFound, ResourceExhausted
from nursery.shm.system import SharedMemoryRegistry

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
    for bad in ("/", "///"):  # Triton's ValidateSharedMemoryKey, before anything is opened
        with pytest.raises(InvalidArgument, match=re.escape(
                f"cannot register shared memory region 'x' - invalid shm key '{bad}'")):
            registry.register_system("x", bad, 0, 8)
    for reserved in ("triton_python_backend_shm_region__k", "///triton_python_backend_shm_region_k"):
        with pytest.raises(InvalidArgument, match=re.escape(
                f"cannot register shared memory region 'x' with key '{reserved}' as the key "
                "contains the reserved prefix 'triton_python_backend_shm_region_'")):
            registry.register_system("x", reserved, 0, 8)
    # an offset plus a byte size past size_t: Triton's overflow words (L0_shared_memory)
    with pytest.raises(InvalidArgument, match=re.escape(
            f"Integer overflow detected: byte_size ({2**64 - 32}) + offset (32) exceeds maximum "
            f"value ({2**64 - 1}) for region 'r'")):
        registry.read("r", 32, 2**64 - 32)
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


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_registrations_are_capped_and_hold_one_fd_each(key: str) -> None:
    reg = SharedMemoryRegistry(max_regions=2)
    before = _open_fds()
    reg.register_system("a", key, 0, 8)
    reg.register_system("b", key, 0, 8)
    assert _open_fds() == before + 2
    with pytest.raises(ResourceExhausted, match="failed to register shared memory region 'c'"):
        reg.register_system("c", key, 0, 8)
    for _ in range(50):  # re-registering, refused or not, never leaks a descriptor
        with pytest.raises(AlreadyExists):
            reg.register_system("a", key, 0, 8)
        reg.unregister("b")
        reg.register_system("b", key, 0, 8)
    assert _open_fds() == before + 2
    reg.close()
    assert _open_fds() == before


def test_a_shrunk_region_is_a_clear_error_and_reads_are_copies(tmp_path: object) -> None:
    name = f"nursery_unit_{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 64)
    reg = SharedMemoryRegistry()
    try:
        reg.register_system("s", "/" + name, 4096, 8192)
        taken = reg.read("s", 0, 8192)  # a queued request's input
        fd = os.open(path, os.O_RDWR)
        os.ftruncate(fd, 100)  # the owner shrinks the object under the registration
        os.close(fd)
        assert bytes(taken[:4]) == bytes([0, 1, 2, 3])  # still the request's own bytes
        with pytest.raises(InvalidArgument, match="now holds 100 bytes"):
            reg.read("s", 0, 16)
        with pytest.raises(InvalidArgument, match="now holds 100 bytes"):
            reg.write("s", 0, 16, b"x" * 16, "OUT")
        assert os.path.getsize(path) == 100  # a refused write never grows the object
    finally:
        reg.close()
        os.unlink(path)


def test_a_sparse_region_is_not_read_into_server_memory() -> None:
    """A key truncated to 1 GiB and never written holds no memory: reading it would have the
    server allocate (and zero) a gigabyte on the client's word."""
    name = f"nursery_unit_{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    reg = SharedMemoryRegistry()
    try:
        os.ftruncate(fd, 1 << 30)
        os.pwrite(fd, b"abcd", 0)  # one page written, the rest a hole
        reg.register_system("sparse", "/" + name, 0, 1 << 30)
        assert bytes(reg.read("sparse", 0, 4)) == b"abcd"
        with pytest.raises(InvalidArgument, match="bytes of memory, fewer than the 1073741824"):
            reg.read("sparse", 0, 1 << 30)
    finally:
        reg.close()
        os.close(fd)
        os.unlink(path)


def _names(reg: SharedMemoryRegistry) -> list[str]:
    return sorted(r["name"] for r in reg.status())


def test_a_held_region_outlives_its_unregistering_until_the_last_request_lets_go(
        key: str) -> None:
    """Triton's requests hold the regions they use: unregistering one in use succeeds at once
    but the region stays (listed, usable, its name taken) until every holder lets go."""
    reg = SharedMemoryRegistry()
    before = _open_fds()
    reg.register_system("in", key, 0, 64)
    reg.register_system("out", key, 64, 64)
    first = reg.hold()
    assert bytes(first.read("in", 0, 4)) == bytes([0, 1, 2, 3])
    first.lookup("out", 0, 64)  # an output named at parsing, written at the answer
    first.lookup("in", 4, 8)  # a second tensor in a held region: held once per request
    reg.unregister_all()  # answers at once...
    assert _names(reg) == ["in", "out"]  # ...and the regions stay while a request holds them
    with pytest.raises(AlreadyExists, match="'in' already in manager"):
        reg.register_system("in", key, 0, 64)
    second = reg.hold()  # a new request may still use them
    second.read("in", 0, 4)
    first.write("out", 0, 64, b"abcd", "OUTPUT0")  # the first answer's output lands
    assert bytes(reg.read("out", 0, 4)) == b"abcd"
    first.release()
    first.release()  # idempotent
    assert _names(reg) == ["in"]  # 'out' had no other holder; 'in' has the second request
    second.release()
    assert _names(reg) == []
    assert _open_fds() == before  # both descriptors closed once the regions went
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'in'"):
        reg.hold().read("in", 0, 4)
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'in'"):
        reg.status("in")


def test_unregistering_by_name_marks_only_that_region_and_free_ones_go_at_once(
        key: str) -> None:
    reg = SharedMemoryRegistry()
    reg.register_system("held", key, 0, 64)
    reg.register_system("free", key, 0, 64)
    hold = reg.hold()
    hold.lookup("held", 0, 64)
    reg.unregister("free")
    reg.unregister("held")
    assert _names(reg) == ["held"]
    hold.release()
    assert _names(reg) == []
    # once gone, the name is free again; a new region of that name is not the old one's
    reg.register_system("held", key, 0, 64)
    stale = reg.hold()
    stale.lookup("held", 0, 64)
    stale.release()
    assert _names(reg) == ["held"]  # released without an unregister: it stays
    reg.close()


def test_a_failed_lookup_holds_nothing_and_shutdown_closes_held_regions(key: str) -> None:
    reg = SharedMemoryRegistry()
    before = _open_fds()
    reg.register_system("r", key, 0, 64)
    hold = reg.hold()
    with pytest.raises(InvalidArgument, match="Invalid offset"):
        hold.lookup("r", 64, 1)
    reg.unregister("r")
    assert _names(reg) == []  # the refused lookup took no hold
    reg.register_system("r", key, 0, 64)
    hold.lookup("r", 0, 8)
    reg.unregister("r")
    reg.close()  # the server stops: every region goes, held or not
    assert _open_fds() == before
    hold.release()  # a request let go after the shutdown: nothing left to close
    assert _names(reg) == []


def test_a_released_hold_takes_no_new_hold(key: str) -> None:
    """A request abandoned (its hold released) and answered afterwards writes its outputs as
    the registry would, without holding the region again: an unregister still removes it."""
    reg = SharedMemoryRegistry()
    reg.register_system("out", key, 0, 64)
    hold = reg.hold()
    hold.lookup("out", 0, 64)
    hold.release()
    hold.write("out", 0, 64, b"late", "OUTPUT0")
    assert bytes(hold.read("out", 0, 4)) == b"late"
    reg.unregister("out")
    assert _names(reg) == []
    with pytest.raises(NotFound):
        hold.write("out", 0, 64, b"late", "OUTPUT0")
    reg.close()
