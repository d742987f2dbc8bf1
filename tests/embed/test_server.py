"""nursery.Server, the in-process API: from plain Python, from trio and from asyncio; bound
Python functions with the dynamic batcher; frontends started on a running server; streams
from a decoupled model; the repository API in explicit mode; bad input."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

import nursery
from nursery import DynamicBatcher, Tensor
from nursery.errors import (
    AlreadyExists,
    InternalError,
    InvalidArgument,
    NotFound,
    StartupError,
    Unavailable,
)
from tests.conftest import ROOT, make_models

MODELS = ROOT / "tests" / "models"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_add_sub(repo, max_batch_size=8)
    make_models.write_mlp(repo)
    make_models.write_string_identity(repo)
    shutil.copytree(MODELS / "py_repeat", repo / "py_repeat")
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[nursery.Server]:
    with nursery.Server(model_repository=repo) as server:
        yield server


@pytest.fixture
def own_repo(tmp_path: Path) -> Path:
    """A repository of the test's own (one Server per repository in a process)."""
    make_models.write_add_sub(tmp_path, max_batch_size=8)
    make_models.write_mlp(tmp_path)
    return tmp_path


def _add_sub_inputs(rows: int = 1) -> dict[str, np.ndarray]:
    a = np.arange(16 * rows, dtype=np.float32).reshape(rows, 16)
    return {"INPUT0": a, "INPUT1": np.ones_like(a)}


# -- plain Python ---------------------------------------------------------------------------

def test_import_stays_light() -> None:
    code = ("import sys, nursery; heavy = {'trio', 'numpy', 'nursery.server'} & "
            "set(sys.modules); assert not heavy, heavy; nursery.Server; "
            "assert 'nursery.server' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_infer_from_plain_python(server: nursery.Server) -> None:
    inputs = _add_sub_inputs(3)
    out = server.infer("add_sub", inputs)
    assert set(out) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_array_equal(out["OUTPUT0"], inputs["INPUT0"] + 1)
    np.testing.assert_array_equal(out["OUTPUT1"], inputs["INPUT0"] - 1)
    only = server.infer("add_sub", inputs, outputs=["OUTPUT1"])
    assert set(only) == {"OUTPUT1"}
    text = server.infer("string_identity", {"INPUT0": np.array([[b"a", b"bc"]], dtype=object)})
    assert text["OUTPUT0"].dtype == object
    assert text["OUTPUT0"].tolist() == [[b"a", b"bc"]]
    strings = server.infer("string_identity", {"INPUT0": np.array([["x", "yz"]])})
    assert strings["OUTPUT0"].tolist() == [[b"x", b"yz"]]


def test_errors_are_nurserys_with_tritons_messages(server: nursery.Server) -> None:
    with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
        server.infer("nope", {"INPUT0": np.zeros((1, 16), np.float32)})
    with pytest.raises(InvalidArgument, match="expects 'FP32'"):
        server.infer("add_sub", {"INPUT0": np.zeros((1, 16), np.int32),
                                 "INPUT1": np.zeros((1, 16), np.float32)})
    with pytest.raises(InvalidArgument, match="INPUT1"):
        server.infer("add_sub", {"INPUT0": np.zeros((1, 16), np.float32)})
    assert server.infer("add_sub", _add_sub_inputs())  # the server goes on


def test_health_metadata_config_statistics(server: nursery.Server) -> None:
    assert server.live() and server.ready()
    assert server.model_ready("mlp") and server.model_ready("mlp", 1)
    meta = server.model_metadata("mlp")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 784]}]
    assert server.model_config("mlp")["max_batch_size"] == 64
    assert server.server_metadata()["name"] == "triton"
    server.infer("mlp", {"INPUT0": np.zeros((2, 784), np.float32)})
    stats = server.statistics("mlp")["model_stats"][0]
    assert stats["name"] == "mlp" and stats["inference_stats"]["success"]["count"] >= 1
    names = {e["name"]: e["state"] for e in server.repository_index()}
    assert names["mlp"] == "READY"


def test_stream_from_a_decoupled_model(server: nursery.Server) -> None:
    parts = list(server.stream("py_repeat", {"IN": np.array([4, 5, 6], np.int32)}))
    assert [p["OUT"].tolist() for p in parts] == [[4], [5], [6]]
    assert [p["IDX"].tolist() for p in parts] == [[0], [1], [2]]
    with pytest.raises(InvalidArgument, match="decoupled"):
        server.infer("py_repeat", {"IN": np.array([1], np.int32)})
    with pytest.raises(nursery.NurseryError, match="negative value at 1"):
        list(server.stream("py_repeat", {"IN": np.array([1, -1, 2], np.int32)}))
    # a model that is not decoupled streams its one response
    (only,) = server.stream("add_sub", _add_sub_inputs())
    assert set(only) == {"OUTPUT0", "OUTPUT1"}


# -- bound Python functions -----------------------------------------------------------------

def test_bind_with_dynamic_batching_forms_batches(server: nursery.Server) -> None:
    sizes: list[int] = []

    def double(x: np.ndarray) -> dict[str, np.ndarray]:
        sizes.append(len(x))
        return {"y": x * 2}

    # the batcher waits (up to 60 s) for the preferred size, so 8 concurrent calls make
    # two batches of 4 whatever the timing
    server.bind("double", double, inputs=[Tensor("x", np.float32, (-1,))],
                outputs=[Tensor("y", np.float32, (-1,))], max_batch_size=4,
                batching=DynamicBatcher(max_queue_delay_microseconds=60_000_000,
                                        preferred_batch_size=[4]))
    try:
        results: list[dict[str, np.ndarray]] = []
        lock = threading.Lock()

        def call(i: int) -> None:
            out = server.infer("double", {"x": np.full((1, 3), i, np.float32)})
            with lock:
                results.append(out)
            assert out["y"].tolist() == [[2.0 * i] * 3]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8
        assert sizes == [4, 4]
        config = server.model_config("double")
        assert config["dynamic_batching"]["preferred_batch_size"] == [4]
        assert config["backend"] == "nursery_callable"
        stats = server.statistics("double")["model_stats"][0]
        assert stats["inference_count"] == 8 and stats["execution_count"] == 2
    finally:
        server.unbind("double")
    with pytest.raises(Exception, match="double"):
        server.infer("double", {"x": np.zeros((1, 3), np.float32)})


def test_bound_function_errors_cost_their_request_only(server: nursery.Server) -> None:
    def picky(x: np.ndarray) -> dict[str, Any]:
        kind = int(x.reshape(-1)[0])
        if kind == 1:
            raise ValueError("one is not allowed")
        if kind == 2:
            return {"y": x.astype(np.float64)}
        if kind == 3:
            return {"z": x}
        if kind == 4:
            return {"y": np.zeros((len(x), 5), np.float32)}
        if kind == 5:
            return [x]  # type: ignore[return-value]
        return {"y": x}

    server.bind("picky", picky, inputs=[Tensor("x", np.float32, (2,))],
                outputs=[Tensor("y", np.float32, (2,))], max_batch_size=2)
    try:
        def ask(kind: int) -> dict[str, np.ndarray]:
            return server.infer("picky", {"x": np.full((1, 2), kind, np.float32)})

        with pytest.raises(InternalError, match="ValueError: one is not allowed"):
            ask(1)
        with pytest.raises(InternalError, match="output 'y' has numpy type float64"):
            ask(2)
        with pytest.raises(InternalError, match="returned no output 'y'"):
            ask(3)
        with pytest.raises(InternalError, match=r"output 'y' has shape \[1, 5\]"):
            ask(4)
        with pytest.raises(InternalError, match="must return a dict"):
            ask(5)
        assert ask(7)["y"].tolist() == [[7.0, 7.0]]
        failed = server.statistics("picky")["model_stats"][0]["inference_stats"]["fail"]
        assert failed["count"] == 5
    finally:
        server.unbind("picky")


def test_bind_refusals(server: nursery.Server) -> None:
    spec = {"inputs": [Tensor("x", np.float32, (1,))], "outputs": [Tensor("y", np.float32, (1,))]}
    # the generated configuration is validated like any model's
    with pytest.raises(nursery.NurseryError,
                       match="dynamic batching preferred size must be <= max batch size"):
        server.bind("bad_batching", lambda x: {"y": x}, **spec, max_batch_size=2,
                    batching=DynamicBatcher(preferred_batch_size=[4]))
    assert "bad_batching" not in {e["name"] for e in server.repository_index()}
    with pytest.raises(ValueError, match="callable"):
        server.bind("nofn", 3, **spec)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        server.bind("nodtype", lambda x: x, inputs=[Tensor("x", "float99", (1,))],
                    outputs=spec["outputs"])
    server.bind("twice", lambda inputs: {"y": inputs["x"]}, **spec)
    try:
        with pytest.raises(AlreadyExists):
            server.bind("twice", lambda x: {"y": x}, **spec)
        # one parameter not named after an input: the inputs come as one dict
        assert server.infer("twice", {"x": np.ones(1, np.float32)})["y"].tolist() == [1.0]
    finally:
        server.unbind("twice")


# -- frontends on a running server ----------------------------------------------------------

def test_frontends_serve_bound_and_repository_models(own_repo: Path) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with nursery.Server(model_repository=own_repo) as server:
        server.bind("triple", lambda **kw: {"y": kw["x"] * 3},
                    inputs=[Tensor("x", np.int32, (-1,))], outputs=[Tensor("y", np.int32, (-1,))],
                    max_batch_size=8, batching=True)
        (http_bind,) = server.serve_http(port=0, address="127.0.0.1")
        (grpc_bind,) = server.serve_grpc(port=0, address="127.0.0.1")
        (metrics_bind,) = server.serve_metrics(port=0, address="127.0.0.1")

        client = httpclient.InferenceServerClient(http_bind)
        assert client.is_server_ready() and client.is_model_ready("triple")
        x = httpclient.InferInput("x", [2, 3], "INT32")
        x.set_data_from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
        answer = client.infer("triple", [x])
        assert answer.as_numpy("y").tolist() == [[0, 3, 6], [9, 12, 15]]
        a = httpclient.InferInput("INPUT0", [1, 784], "FP32")
        a.set_data_from_numpy(np.zeros((1, 784), np.float32))
        assert client.infer("mlp", [a]).as_numpy("OUTPUT0").shape == (1, 10)
        client.close()

        grpc = grpcclient.InferenceServerClient(grpc_bind)
        g = grpcclient.InferInput("x", [1, 2], "INT32")
        g.set_data_from_numpy(np.array([[1, 2]], np.int32))
        assert grpc.infer("triple", [g]).as_numpy("y").tolist() == [[3, 6]]
        grpc.close()

        with urllib.request.urlopen(f"http://{metrics_bind}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'nv_inference_request_success{model="triple",version="1"} 2' in text
    assert server.closed


# -- the repository API ---------------------------------------------------------------------

def test_load_unload_in_explicit_mode(own_repo: Path) -> None:
    with nursery.Server(model_repository=own_repo, model_control_mode="explicit",
                        load_model=["add_sub"]) as server:
        states = {e["name"]: e.get("state") for e in server.repository_index()}
        assert states["add_sub"] == "READY" and states.get("mlp") is None
        server.load("mlp")
        assert server.model_ready("mlp")
        server.unload("mlp")
        assert not server.model_ready("mlp")
        server.load("add_sub", config={"max_batch_size": 2, "backend": "onnxruntime",
                                       "input": [{"name": "INPUT0", "data_type": "TYPE_FP32",
                                                  "dims": [16]},
                                                 {"name": "INPUT1", "data_type": "TYPE_FP32",
                                                  "dims": [16]}],
                                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32",
                                                   "dims": [16]},
                                                  {"name": "OUTPUT1", "data_type": "TYPE_FP32",
                                                   "dims": [16]}]})
        assert server.model_config("add_sub")["max_batch_size"] == 2
        with pytest.raises(nursery.NurseryError, match="failed to parse the 'config'"):
            server.load("add_sub", config="{not json")
        with pytest.raises(nursery.NurseryError, match="Model file upload is disabled"):
            server.load("add_sub", config={"backend": "onnxruntime"},
                        files={"1/model.onnx": b"x"})


def test_load_with_files_when_uploads_are_allowed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with nursery.Server(model_repository=repo, model_control_mode="explicit",
                        allow_model_file_upload=True) as server:
        model = make_models.build_add_sub().SerializeToString()
        config = {"backend": "onnxruntime", "max_batch_size": 4,
                  "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]}
                            for n in ("INPUT0", "INPUT1")],
                  "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]}
                             for n in ("OUTPUT0", "OUTPUT1")]}
        server.load("uploaded", config=config, files={"1/model.onnx": model})
        out = server.infer("uploaded", _add_sub_inputs())
        np.testing.assert_array_equal(out["OUTPUT0"], _add_sub_inputs()["INPUT0"] + 1)


def test_a_server_of_bound_functions_only() -> None:
    with nursery.Server() as server:  # no repository of its own
        server.bind("negate", lambda v: {"w": -v}, inputs=[Tensor("v", "INT64", (2,))],
                    outputs=[Tensor("w", "INT64", (2,))])
        assert server.infer("negate", {"v": np.array([1, -2])})["w"].tolist() == [-1, 2]
        assert [e["name"] for e in server.repository_index()] == ["negate"]


def test_load_outside_explicit_mode_is_refused_as_triton_does(server: nursery.Server) -> None:
    with pytest.raises(Unavailable, match="polling is enabled"):
        server.load("mlp")


# -- bad input ------------------------------------------------------------------------------

def test_bad_flags_raise_value_error_naming_the_flag(repo: Path) -> None:
    with pytest.raises(ValueError, match="--bogus-flag"):
        nursery.Server(model_repository=repo, bogus_flag=1)
    with pytest.raises(ValueError, match="--log-verbose"):
        nursery.Server(model_repository=repo, log_verbose="loud")
    with pytest.raises(ValueError, match="--load-model only takes effect"):
        nursery.Server(model_repository=repo, load_model=["mlp"])
    with pytest.raises(ValueError, match="--model-control-mode"):
        nursery.Server(model_repository=repo, model_control_mode="sometimes")


def test_startup_failure_raises(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="failed to load all models: .*missing"):
        nursery.Server(model_repository=tmp_path / "missing")


def test_two_servers_on_one_repository(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    make_models.write_add_sub(other)
    with nursery.Server(model_repository=other) as first:
        with pytest.raises(AlreadyExists, match="already served by another nursery.Server"):
            nursery.Server(model_repository=[str(other)])
        assert first.infer("add_sub", _add_sub_inputs())
    with nursery.Server(model_repository=other) as second:  # free again once closed
        assert second.infer("add_sub", _add_sub_inputs())


def test_calls_after_close_are_refused(tmp_path: Path) -> None:
    make_models.write_add_sub(tmp_path)
    server = nursery.Server(model_repository=tmp_path)
    server.close()
    server.close()  # idempotent
    with pytest.raises(Unavailable, match="the nursery.Server is closed"):
        server.infer("add_sub", _add_sub_inputs())
    with pytest.raises(Unavailable, match="closed"):
        server.serve_http(port=0)
    assert not server.live()


# -- from a trio program --------------------------------------------------------------------

async def test_from_trio(server: nursery.Server) -> None:
    results: dict[int, np.ndarray] = {}

    async def one(i: int) -> None:
        inputs = _add_sub_inputs()
        inputs["INPUT1"] = np.full((1, 16), i, np.float32)
        results[i] = (await server.ainfer("add_sub", inputs))["OUTPUT0"]

    async with trio.open_nursery() as calls:
        for i in range(10):
            calls.start_soon(one, i)
    for i, out in results.items():
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32)[None] + i)
    assert len(results) == 10
    parts = [p async for p in server.astream("py_repeat", {"IN": np.array([7, 8], np.int32)})]
    assert [p["OUT"].tolist() for p in parts] == [[7], [8]]
    with pytest.raises(NotFound):
        await server.ainfer("nope", {})


async def test_trio_cancellation_cancels_the_request(server: nursery.Server) -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(x: np.ndarray) -> dict[str, np.ndarray]:
        started.set()
        release.wait(60)
        return {"y": x}

    server.bind("slow", slow, inputs=[Tensor("x", np.float32, (1,))],
                outputs=[Tensor("y", np.float32, (1,))])
    try:
        async with trio.open_nursery() as calls:
            calls.start_soon(server.ainfer, "slow", {"x": np.ones(1, np.float32)})
            await trio.to_thread.run_sync(started.wait, 60)
            calls.cancel_scope.cancel()  # the caller leaves; the function still finishes
        release.set()
        assert (await server.ainfer("slow", {"x": np.ones(1, np.float32)}))["y"].tolist() == [1]
    finally:
        release.set()
        server.unbind("slow")


# -- from an asyncio program ----------------------------------------------------------------

def test_from_asyncio(server: nursery.Server) -> None:
    async def main() -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        answers = await asyncio.gather(*[
            server.ainfer("add_sub", _add_sub_inputs(2)) for _ in range(10)])
        parts = [p async for p in server.astream("py_repeat",
                                                 {"IN": np.array([1, 2, 3], np.int32)})]
        with pytest.raises(NotFound):
            await server.ainfer("nope", {})
        return list(answers), parts

    answers, parts = asyncio.run(main())
    assert len(answers) == 10
    for out in answers:
        np.testing.assert_array_equal(out["OUTPUT0"], _add_sub_inputs(2)["INPUT0"] + 1)
    assert [p["OUT"].tolist() for p in parts] == [[1], [2], [3]]


def test_bound_batches_form_under_asyncio(server: nursery.Server) -> None:
    sizes: list[int] = []

    def echo(x: np.ndarray) -> dict[str, np.ndarray]:
        sizes.append(len(x))
        return {"y": x}

    server.bind("echo_batched", echo, inputs=[Tensor("x", np.float32, (1,))],
                outputs=[Tensor("y", np.float32, (1,))], max_batch_size=8,
                batching=DynamicBatcher(max_queue_delay_microseconds=60_000_000,
                                        preferred_batch_size=[8]))
    try:
        async def main() -> list[dict[str, np.ndarray]]:
            return list(await asyncio.gather(*[
                server.ainfer("echo_batched", {"x": np.full((1, 1), i, np.float32)})
                for i in range(16)]))

        answers = asyncio.run(main())
        assert sorted(int(a["y"][0, 0]) for a in answers) == list(range(16))
        assert sizes == [8, 8]
    finally:
        server.unbind("echo_batched")
