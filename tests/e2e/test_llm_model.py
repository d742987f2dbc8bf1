"""The bundled tiny_llm through ``python -m nursery serve``, with NVIDIA's tritonclient: gRPC
streaming (one response per token, then the final flag) and one final response without
``stream``, token counts, seeded sampling, LoRA adapters per request sharing the decode
loop, bad input answered with its reason while other requests go on, a client that leaves
mid-stream (its sequence stops and its slot frees: the model's metrics say so), and the
HTTP port's refusal of a decoupled model on /infer, as Triton's."""

from __future__ import annotations

import queue
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, running_server

pytestmark = pytest.mark.e2e

MODEL = "tiny_llm"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


class Stream:
    """A gRPC stream and the responses (or errors) of each request on it, by request id."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.answers.put((result, error)))

    def send(self, request_id: str, prompt: str, parameters: dict[str, Any] | None = None,
             **inputs: Any) -> None:
        tensors = [_input("text_input", np.array([[prompt.encode()]], dtype=np.object_))]
        for name, value in inputs.items():
            tensors.append(_input(name, value))
        self.client.async_stream_infer(MODEL, tensors, request_id=request_id,
                                       parameters=parameters,
                                       enable_empty_final_response=True)

    def collect(self, count: int = 1) -> dict[str, list[Any]]:
        """Until ``count`` requests have ended: their responses (or errors) by id."""
        out: dict[str, list[Any]] = {}
        done = 0
        while done < count:
            result, error = self.answers.get(timeout=60)
            if error is not None:  # tritonclient gives a stream error without its request id
                out.setdefault("error", []).append(error)
                done += 1
                continue
            rid = result.get_response().id
            out.setdefault(rid, []).append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                done += 1
        return out

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _input(name: str, value: Any) -> grpcclient.InferInput:
    array = np.asarray(value)
    datatype = {np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "INT32",
                np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64"}.get(
        array.dtype, "BYTES")
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _one(value: Any, dtype: Any) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def _text(results: list[Any]) -> str:
    return "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in results
                   if r.as_numpy("text_output") is not None)


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[Stream]:
    s = Stream(server)
    yield s
    s.close()


def test_streams_one_response_per_token_with_counts(stream: Stream) -> None:
    stream.send("s", "The server loads models", stream=_one(True, np.bool_),
                max_tokens=_one(6, np.int32), return_num_output_tokens=_one(True, np.bool_),
                return_num_input_tokens=_one(True, np.bool_))
    responses = stream.collect()["s"]
    assert len(responses) == 6  # one per token; the last carries the final flag
    finals = [r.get_response().parameters["triton_final_response"].bool_param
              for r in responses]
    assert finals == [False] * 5 + [True]
    assert [int(r.as_numpy("num_output_tokens").reshape(-1)[0]) for r in responses] == [1] * 6
    n_in = {int(r.as_numpy("num_input_tokens").reshape(-1)[0]) for r in responses}
    assert len(n_in) == 1 and n_in.pop() > 1
    assert responses[0].as_numpy("text_output").shape == (1, 1)


def test_without_stream_one_final_response_and_a_seed_repeats_itself(stream: Stream) -> None:
    def generate(rid: str, seed: int) -> list[Any]:
        stream.send(rid, "Hello", max_tokens=_one(12, np.int32), seed=_one(seed, np.uint64),
                    temperature=_one(0.9, np.float32), top_k=_one(50, np.int32),
                    return_num_output_tokens=_one(True, np.bool_))
        return stream.collect()[rid]

    first, again, other = generate("a", 11), generate("b", 11), generate("c", 12)
    assert len(first) == 1
    assert int(first[0].as_numpy("num_output_tokens").reshape(-1)[0]) == 12
    assert _text(first) == _text(again) and _text(first)
    assert _text(first) != _text(other)


def test_greedy_is_the_same_alone_and_beside_other_requests(stream: Stream) -> None:
    """Continuous batching changes nothing in what a request gets: greedy decoding alone and
    among eight concurrent requests with other prompts and lengths gives the same text."""
    greedy = {"temperature": _one(0.0, np.float32), "max_tokens": _one(20, np.int32)}
    stream.send("alone", "the repository", **greedy)
    alone = _text(stream.collect()["alone"])
    for i in range(8):
        stream.send(f"n{i}", f"noise {i} " * (i + 1), max_tokens=_one(5 + 3 * i, np.int32),
                    stream=_one(True, np.bool_))
    stream.send("crowd", "the repository", **greedy)
    got = stream.collect(9)
    assert _text(got["crowd"]) == alone
    assert all(len(got[f"n{i}"]) == 5 + 3 * i for i in range(8))


def test_lora_adapters_per_request(stream: Stream) -> None:
    greedy = {"temperature": _one(0.0, np.float32), "max_tokens": _one(16, np.int32)}
    for lora in ("", "alpha", "beta"):
        stream.send(lora or "base", "Serve the models", {"lora_name": lora} if lora else None,
                    **greedy)
    got = stream.collect(3)
    texts = {rid: _text(rs) for rid, rs in got.items()}
    assert len(set(texts.values())) == 3, texts  # each adapter changes the answer
    stream.send("again", "Serve the models", {"lora_name": "alpha"}, **greedy)
    assert _text(stream.collect()["again"]) == texts["alpha"]
    stream.send("x", "Serve the models", {"lora_name": "gamma"}, **greedy)
    error = stream.collect()["error"][0]
    assert "LoRA 'gamma' is not available for model 'tiny_llm' (available: alpha, beta)" in \
        error.message()


def test_stop_words_end_the_text_before_them_and_the_prompt_comes_back_when_asked(
        stream: Stream) -> None:
    greedy = {"temperature": _one(0.0, np.float32), "max_tokens": _one(24, np.int32)}
    stream.send("full", "Serve the models", **greedy)
    full = _text(stream.collect()["full"])
    stop = full[len(full) // 2:len(full) // 2 + 3]
    stream.send("cut", "Serve the models", stop_words=np.array([[stop.encode(), b"unseen"]],
                                                                dtype=np.object_), **greedy)
    assert _text(stream.collect()["cut"]) == full[:full.index(stop)]
    stream.send("echo", "Serve the models", exclude_input_in_output=_one(False, np.bool_),
                **greedy)
    assert _text(stream.collect()["echo"]) == "Serve the models" + full


@pytest.mark.parametrize(("inputs", "message"), [
    ({"max_tokens": _one(0, np.int32)}, "max_tokens must be at least 1, got 0"),
    ({"max_tokens": _one(600, np.int32)},
     "This model's maximum context length is 512 tokens. However, you requested"),
    ({"temperature": _one(-1.0, np.float32)}, "temperature must be a number >= 0"),
    ({"top_p": _one(0.0, np.float32)}, "top_p must be in (0, 1]"),
])
def test_bad_input_gets_its_reason_and_harms_nothing(stream: Stream, inputs: dict[str, Any],
                                                     message: str) -> None:
    stream.send("long", "a long one", max_tokens=_one(30, np.int32), stream=_one(True, np.bool_))
    stream.send("bad", "hello", **inputs)
    got = stream.collect(2)
    assert message in got["error"][0].message()
    assert len(got["long"]) == 30  # the request beside it went on


def test_a_prompt_longer_than_the_context_is_refused(stream: Stream) -> None:
    stream.send("huge", "words " * 600, max_tokens=_one(1, np.int32))
    error = stream.collect()["error"][0]
    assert "maximum context length is 512 tokens" in error.message()
    assert re.search(r"\((\d+) in the prompt, 1 for the completion\)", error.message())


def test_two_prompts_in_one_request_are_refused_by_the_server(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error))
    prompts = _input("text_input", np.array([[b"a"], [b"b"]], dtype=np.object_))
    client.async_stream_infer(MODEL, [prompts])
    error = answers.get(timeout=30)
    client.stop_stream()
    assert error is not None and "batch-size must be <= 1 for 'tiny_llm'" in error.message()


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    want = {"model": MODEL, "version": "1", **labels}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if found == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_leaves_mid_stream_stops_its_sequence_and_frees_the_slot(
        server: ServerProcess) -> None:
    cancelled = metric(server, "nursery_llm_sequences_total", outcome="cancelled")
    leaving = Stream(server)
    leaving.send("long", "tell me everything", stream=_one(True, np.bool_),
                 max_tokens=_one(500, np.int32))
    first, error = leaving.answers.get(timeout=60)
    assert error is None and first.as_numpy("text_output") is not None
    leaving.close(cancel=True)  # the client goes away in the middle of 500 tokens
    for _ in range(600):  # until the decode loop has noticed (bounded: no test waits for ever)
        if metric(server, "nursery_llm_sequences_total", outcome="cancelled") > cancelled:
            break
        time.sleep(0.05)
    assert metric(server, "nursery_llm_sequences_total", outcome="cancelled") == cancelled + 1
    assert metric(server, "nursery_llm_active_sequences") == 0
    # and the model goes on serving
    other = Stream(server)
    try:
        other.send("next", "still there?", max_tokens=_one(3, np.int32))
        assert len(other.collect()["next"]) == 1
    finally:
        other.close()


def test_http_infer_refuses_the_decoupled_model_as_triton_does(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config(MODEL)
    assert config["model_transaction_policy"]["decoupled"] is True
    assert [i["name"] for i in client.get_model_metadata(MODEL)["inputs"]][:3] == [
        "text_input", "stream", "max_tokens"]
    prompt = httpclient.InferInput("text_input", [1, 1], "BYTES")
    prompt.set_data_from_numpy(np.array([[b"hi"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [prompt])
    assert "doesn't support models with decoupled transaction policy" in raised.value.message()
    client.close()


def test_in_a_stub_process_streams_and_cancels_the_same(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """nursery_instance_mode process: the decode loop runs in the model's stub process; its
    responses, the cancellation of a client that leaves and the custom metrics cross over."""
    repo = tmp_path_factory.mktemp("process")
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "nursery_instance_mode" '
                      'value: { string_value: "process" } }\n')
    with running_server(repo, tmp_path_factory=tmp_path_factory) as server:
        stream = Stream(server)
        try:
            stream.send("s", "hello", stream=_one(True, np.bool_), max_tokens=_one(5, np.int32))
            assert len(stream.collect()["s"]) == 5
        finally:
            stream.close()
        leaving = Stream(server)
        leaving.send("long", "hello", stream=_one(True, np.bool_), max_tokens=_one(500, np.int32))
        first, error = leaving.answers.get(timeout=60)
        assert error is None
        leaving.close(cancel=True)
        for _ in range(600):
            if metric(server, "nursery_llm_sequences_total", outcome="cancelled") == 1:
                break
            time.sleep(0.05)
        assert metric(server, "nursery_llm_sequences_total", outcome="cancelled") == 1
        assert metric(server, "nursery_llm_active_sequences") == 0


@pytest.mark.parametrize(("parameter", "value", "reason"), [
    ("batching_mode", "eager",
     "batching_mode must be one of continuous, static, sequential; got 'eager'"),
    ("max_num_batched_tokens", "0", "max_num_batched_tokens must be at least 1, got 0"),
    ("max_num_batched_tokens", "lots",
     "parameter 'max_num_batched_tokens' must be an integer, got 'lots'"),
    ("max_prefill_overhead", "-0.5",
     "parameter 'max_prefill_overhead' must be a number >= 0 or 'off', got '-0.5'"),
    ("max_prefill_overhead", "some",
     "parameter 'max_prefill_overhead' must be a number >= 0 or 'off', got 'some'")])
def test_a_bad_batching_parameter_fails_the_load_with_its_reason(
        parameter: str, value: str, reason: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("badmode")
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('"batching_mode"', '"unused"') +
                      f'parameters {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}\n')
    with running_server(repo, "--exit-on-error=false", "--strict-readiness=false",
                        tmp_path_factory=tmp_path_factory) as server:
        client = httpclient.InferenceServerClient(server.url)
        (entry,) = client.get_model_repository_index()
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert reason in entry["reason"]
