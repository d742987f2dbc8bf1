"""The system shared memory extension end to end with ``tritonclient.utils.shared_memory``:
register / status / unregister over HTTP and gRPC, inputs read from and outputs written into
regions (offsets included), every bound checked with Triton's messages, and regions whose
owner removes or shrinks them while registered giving a clear error, never a crash."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from tests.conftest import ServerProcess, make_models, running_server
from tests.shm_client import system_shm as shm

pytestmark = pytest.mark.e2e
Http = httpclient.InferenceServerClient
Grpc = grpcclient.InferenceServerClient


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("shm_repo")
    make_models.write_add_sub(repo)
    make_models.write_string_identity(repo)
    with running_server(repo, "--allow-client-shm=true",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


@pytest.fixture(scope="module")
def grpc_client(shm_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def http(shm_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(shm_server.url)
    yield client
    client.close()


class Regions:
    """Client-side regions, destroyed (and unregistered) at the end of a test."""

    def __init__(self) -> None:
        self.handles: list[object] = []
        self.tag = uuid.uuid4().hex[:8]

    def create(self, name: str, size: int) -> tuple[str, str, object]:
        name = f"{name}_{self.tag}"
        key = f"/nursery_test_{name}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append(handle)
        return name, key, handle

    def destroy(self, handle: object) -> None:
        if handle in self.handles:
            self.handles.remove(handle)
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(http: httpclient.InferenceServerClient) -> Iterator[Regions]:
    r = Regions()
    yield r
    http.unregister_system_shared_memory()
    for handle in list(r.handles):
        r.destroy(handle)


A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 2.0, np.float32)


def test_http_inputs_and_outputs_in_shared_memory(http: Http, grpc_client: Grpc, shm_server: ServerProcess,
                                                  regions: Regions) -> None:
    client = http
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    in_name, in_key, in_handle = regions.create("in", 128)
    out_name, out_key, out_handle = regions.create("out", 128)
    shm.set_shared_memory_region(in_handle, [A, B])  # A at 0, B at 64
    client.register_system_shared_memory(in_name, in_key, 128)
    client.register_system_shared_memory(out_name, out_key, 128)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status[in_name] == {"name": in_name, "key": in_key, "offset": 0, "byte_size": 128}
    assert client.get_system_shared_memory_status(out_name)[0]["key"] == out_key

    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32").set_shared_memory(in_name, 64),
              httpclient.InferInput("INPUT1", [1, 16], "FP32").set_shared_memory(in_name, 64, 64)]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"),
               httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(out_name, 64)
    outputs[1].set_shared_memory(out_name, 64, offset=64)
    result = client.infer("add_sub", inputs, outputs=outputs)
    entry = result.get_output("OUTPUT1")  # as Triton: no data, no parameters
    assert entry == {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16]}
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 16]), A + B)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_handle, np.float32, [1, 16], offset=64), A - B)

    # a region mixed with an inline input, and an inline output next to a shared one
    inputs[1] = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    inputs[1].set_data_from_numpy(B * 3)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    outputs[0].set_shared_memory(out_name, 64)
    result = client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 16]), A + 3 * B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - 3 * B)

    client.unregister_system_shared_memory(in_name)
    assert [r["name"] for r in client.get_system_shared_memory_status()] == [out_name]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_grpc_inputs_and_outputs_in_shared_memory(http: Http, grpc_client: Grpc, shm_server: ServerProcess,
                                                  regions: Regions) -> None:
    client = grpc_client
    name, key, handle = regions.create("grpc", 4096 + 256)
    shm.set_shared_memory_region(handle, [B], offset=4096 + 64)
    # registered from a page offset: the region's own offsets count from there
    client.register_system_shared_memory(name, key, 256, offset=4096)
    status = client.get_system_shared_memory_status(as_json=True)["regions"][name]
    assert status["key"] == key and int(status["offset"]) == 4096
    a = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(A)  # inline, before a shared-memory input: raw contents stay aligned
    b = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_shared_memory(name, 64, offset=64)
    out0 = grpcclient.InferRequestedOutput("OUTPUT0")
    out0.set_shared_memory(name, 64, offset=128)
    out1 = grpcclient.InferRequestedOutput("OUTPUT1")
    result = client.infer("add_sub", [a, b], outputs=[out0, out1])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert list(result.get_output("OUTPUT0").shape) == [1, 16]
    assert result.get_response().raw_output_contents[0] == b""  # aligned, empty
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handle, np.float32, [1, 16], offset=4096 + 128), A + B)
    client.unregister_system_shared_memory(name)
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_bytes_tensor_through_shared_memory(http: Http, grpc_client: Grpc,
                                            shm_server: ServerProcess, regions: Regions) -> None:
    client = http
    words = np.array([[b"alpha", b"beta", b"\xce\xbb"]], dtype=object)
    serialized = serialize_byte_tensor(words)
    size = serialized_byte_size(serialized)
    name, key, handle = regions.create("bytes", 256)
    shm.set_shared_memory_region(handle, [serialized])
    client.register_system_shared_memory(name, key, 256)
    inp = httpclient.InferInput("INPUT0", [1, 3], "BYTES").set_shared_memory(name, size)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(name, 128, offset=128)
    result = client.infer("string_identity", [inp], outputs=[out])
    assert result.get_output("OUTPUT0")["shape"] == [1, 3]
    back = shm.get_contents_as_numpy(handle, np.object_, [1, 3], offset=128)
    assert back.tolist() == words.tolist()


def _error(call: object, *args: object, **kwargs: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value


def test_bad_registrations_are_refused(http: Http, grpc_client: Grpc,
                                       shm_server: ServerProcess, regions: Regions) -> None:
    client = http
    grpc = grpc_client
    name, key, _ = regions.create("small", 64)
    err = _error(client.register_system_shared_memory, name, key, 128)
    assert err.message() == f"failed to register shared memory region '{name}': invalid args"
    err = _error(grpc.register_system_shared_memory, name, key, 32, offset=64)
    assert "invalid args" in err.message() and err.status() == "StatusCode.INVALID_ARGUMENT"
    err = _error(client.register_system_shared_memory, "nokey", "/nursery_no_such_key", 8)
    assert err.message() == "Unable to open shared memory region: '/nursery_no_such_key'"
    for bad_key in ("/../../etc/passwd", "/dev/null", ".."):
        err = _error(client.register_system_shared_memory, "evil", bad_key, 8)
        assert err.message() == f"Unable to open shared memory region: '{bad_key}'"
    for bad_key in ("/", "///"):  # Triton's ValidateSharedMemoryKey (L0_shared_memory)
        err = _error(client.register_system_shared_memory, "evil", bad_key, 8)
        assert err.message() == (f"cannot register shared memory region 'evil' - invalid shm "
                                 f"key '{bad_key}'")
    client.register_system_shared_memory(name, key, 64)
    err = _error(grpc.register_system_shared_memory, name, key, 64)
    assert err.message() == f"shared memory region '{name}' already in manager"
    assert err.status() == "StatusCode.ALREADY_EXISTS"
    err = _error(client.get_system_shared_memory_status, "nope")
    assert err.message() == "Unable to find system shared memory region: 'nope'"
    client.unregister_system_shared_memory("never_registered")  # succeeds, as in Triton


def test_out_of_bounds_requests_are_refused(http: Http, grpc_client: Grpc,
                                            shm_server: ServerProcess, regions: Regions) -> None:
    client = http
    grpc = grpc_client
    name, key, handle = regions.create("bounds", 128)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory(name, key, 128)

    def infer(module: object, in1: tuple[int, int], out: tuple[int, int] | None = None,
              region: str = name) -> InferenceServerException:
        a = module.InferInput("INPUT0", [1, 16], "FP32")  # type: ignore[attr-defined]
        a.set_shared_memory(name, 64)
        b = module.InferInput("INPUT1", [1, 16], "FP32")  # type: ignore[attr-defined]
        b.set_shared_memory(region, in1[0], offset=in1[1])
        outputs = None
        if out is not None:
            o = module.InferRequestedOutput("OUTPUT0")  # type: ignore[attr-defined]
            o.set_shared_memory(name, out[0], offset=out[1])
            outputs = [o]
        c = client if module is httpclient else grpc
        return _error(c.infer, "add_sub", [a, b], outputs=outputs)

    for module in (httpclient, grpcclient):
        err = infer(module, (64, 128))
        assert err.message() == f"Invalid offset for shared memory region: '{name}'"
        err = infer(module, (64, 100))
        assert err.message() == f"Invalid offset + byte size for shared memory region: '{name}'"
        err = infer(module, (32, 64))
        assert "input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, " \
               "got 32" in err.message()
        err = infer(module, (64, 64), region="unknown_region")
        assert err.message() == "Unable to find shared memory region: 'unknown_region'"
        err = infer(module, (64, 64), out=(32, 0))
        assert err.message() == ("shared memory size specified with the request for output "
                                 "'OUTPUT0' (32 bytes) should be at least 64 bytes to hold the "
                                 "results")
        err = infer(module, (64, 64), out=(64, 96))
        assert err.message() == f"Invalid offset + byte size for shared memory region: '{name}'"
    # nothing above harmed the region or the server
    a = httpclient.InferInput("INPUT0", [1, 16], "FP32").set_shared_memory(name, 64)
    b = httpclient.InferInput("INPUT1", [1, 16], "FP32").set_shared_memory(name, 64, 64)
    result = client.infer("add_sub", [a, b])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_grpc_parameter_type_checks(http: Http, grpc_client: Grpc, shm_server: ServerProcess) -> None:
    client = grpc_client
    a = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(A)
    b = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(B)
    b._input.parameters["shared_memory_offset"].int64_param = 0
    err = _error(client.infer, "add_sub", [a, b])
    assert err.message() == ("'shared_memory_offset' can not be specified without "
                             "'shared_memory_region' parameter for tensor 'INPUT1'")
    b = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    b._input.parameters["shared_memory_region"].string_param = "r"
    err = _error(client.infer, "add_sub", [a, b])
    assert err.message() == ("'shared_memory_byte_size' must be specified along with "
                             "'shared_memory_region' parameter for tensor 'INPUT1'")


def test_region_removed_or_shrunk_while_registered(http: Http, grpc_client: Grpc, shm_server: ServerProcess,
                                                   regions: Regions) -> None:
    client = http
    name, key, handle = regions.create("vanish", 128)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory(name, key, 128)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32").set_shared_memory(name, 64),
              httpclient.InferInput("INPUT1", [1, 16], "FP32").set_shared_memory(name, 64, 64)]
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), A + B)
    # the owner shrinks it: reading would fault on pages that are gone
    fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR)
    try:
        os.ftruncate(fd, 32)
    finally:
        os.close(fd)
    err = _error(client.infer, "add_sub", inputs)
    assert f"shared memory region '{name}': its key '{key}' now holds 32 bytes" in err.message()
    # the owner removes it
    regions.destroy(handle)
    err = _error(client.infer, "add_sub", inputs)
    assert f"its key '{key}' was removed by its owner; unregister the region" in err.message()
    assert client.get_system_shared_memory_status(name)[0]["name"] == name
    client.unregister_system_shared_memory(name)
    assert client.is_server_live() and client.is_model_ready("add_sub")


def test_cuda_shared_memory_answers_clearly(http: Http, grpc_client: Grpc, shm_server: ServerProcess) -> None:
    """Status works everywhere; registering a bogus handle is refused with Triton's "invalid
    args" (400), followed where this server cannot open CUDA regions (no GPU / no CuPy) by the
    reason, as Triton's GPU build answers on a machine without a device."""
    client = http
    grpc = grpc_client
    assert client.get_cuda_shared_memory_status() == []
    assert grpc.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
    gpu = "cuda_shared_memory" in client.get_server_metadata()["extensions"]
    bogus = base64.b64encode(b"\0" * 64)
    for register in (client.register_cuda_shared_memory, grpc.register_cuda_shared_memory):
        err = _error(register, "cuda_region", bogus, 0, 64)
        if gpu:
            assert err.message() == "failed to register shared memory region: invalid args"
        else:
            assert err.message().startswith(
                "failed to register shared memory region: invalid args (CUDA shared memory is "
                "not available on this server")
        assert err.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    err = _error(client.get_cuda_shared_memory_status, "nope")
    assert err.message() == "Unable to find cuda shared memory region: 'nope'"


def test_grpc_stream_uses_shared_memory(http: Http, grpc_client: Grpc,
                                        shm_server: ServerProcess, regions: Regions) -> None:
    import queue

    client = grpc_client
    name, key, handle = regions.create("stream", 192)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory(name, key, 192)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        a = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        a.set_shared_memory(name, 64)
        b = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        b.set_shared_memory(name, 64, offset=64)
        out = grpcclient.InferRequestedOutput("OUTPUT1")
        out.set_shared_memory(name, 64, offset=128)
        client.async_stream_infer("add_sub", [a, b], outputs=[out])
        result, error = results.get(timeout=30)
        assert error is None
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(handle, np.float32, [1, 16], offset=128), A - B)
        bad = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        bad.set_shared_memory(name, 64, offset=160)
        client.async_stream_infer("add_sub", [a, bad])
        result, error = results.get(timeout=30)
        assert error is not None and "Invalid offset + byte size" in str(error)
    finally:
        client.stop_stream()
