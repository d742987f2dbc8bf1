"""Many concurrent token streams through the bundled tiny_llm, with NVIDIA's tritonclient
(gRPC streams), in a stub process (Triton's default) and on the server's thread: a decode
step's responses for many requests travel together (``coalesce_responses``), and prompts are
spread over steps by a small token budget (chunked prefill). Every request still gets all
its tokens, one response each, in order, its final flag last and nothing after it, and the
same text as the same greedy request run alone without streaming."""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ROOT, ServerProcess, running_server

pytestmark = pytest.mark.e2e

MODEL = "tiny_llm"
CLIENTS = 12  # streams, each with its own gRPC client
PER_STREAM = 3  # requests in flight on each stream at once
WORDS = ["serve", "the", "model", "repository", "decode", "loop", "batch", "tokens"]


@pytest.fixture(scope="module", params=["process", "thread"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "model_repository" / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    text = config.read_text().replace('key: "max_slots" value: { string_value: "32" }',
                                      'key: "max_slots" value: { string_value: "8" }')
    text += ('parameters { key: "max_num_batched_tokens" value: { string_value: "5" } }\n'
             f'parameters {{ key: "nursery_instance_mode" value: {{ string_value: '
             f'"{request.param}" }} }}\n')
    config.write_text(text)
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _input(name: str, value: Any, datatype: str) -> grpcclient.InferInput:
    array = np.array([[value]], dtype=np.object_ if datatype == "BYTES" else None)
    if datatype == "INT32":
        array = array.astype(np.int32)
    elif datatype == "FP32":
        array = array.astype(np.float32)
    tensor = grpcclient.InferInput(name, [1, 1], datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _inputs(prompt: str, max_tokens: int, stream: bool) -> list[grpcclient.InferInput]:
    return [_input("text_input", prompt.encode(), "BYTES"),
            _input("stream", stream, "BOOL"),
            _input("max_tokens", max_tokens, "INT32"),
            _input("temperature", 0.0, "FP32"),
            _input("return_num_output_tokens", True, "BOOL")]


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _text(result: Any) -> str:
    out = result.as_numpy("text_output")
    return "" if out is None else out.reshape(-1)[0].decode()


def _count(result: Any) -> int:
    out = result.as_numpy("num_output_tokens")
    return 0 if out is None else int(out.reshape(-1)[0])


def _run_stream(server: ServerProcess, worker: int, jobs: dict[str, tuple[str, int]],
                got: dict[str, list[Any]], errors: list[str], start: threading.Barrier) -> None:
    """One gRPC stream: its requests all sent at once, then every response until each has
    ended, and then a last request, so anything sent after a final flag would show."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        start.wait()
        mine = [rid for rid in jobs if rid.startswith(f"w{worker}-")]
        for rid in mine:
            prompt, max_tokens = jobs[rid]
            client.async_stream_infer(MODEL, _inputs(prompt, max_tokens, True), request_id=rid,
                                      enable_empty_final_response=True)
        open_ = set(mine)
        last = f"w{worker}-last"
        sent_last = False
        while open_:
            result, error = answers.get(timeout=120)
            if error is not None:
                errors.append(str(error))
                return
            rid = result.get_response().id
            got.setdefault(rid, []).append(result)
            if _final(result):
                open_.discard(rid)
            if not open_ and not sent_last:
                client.async_stream_infer(MODEL, _inputs("the end", 2, True), request_id=last,
                                          enable_empty_final_response=True)
                open_.add(last)
                sent_last = True
    finally:
        client.stop_stream()
        client.close()


def test_many_concurrent_streams_get_every_token_in_order(server: ServerProcess) -> None:
    rng = np.random.default_rng(5)
    jobs = {}
    for worker in range(CLIENTS):
        for n in range(PER_STREAM):
            words = rng.choice(WORDS, size=int(rng.integers(1, 40)))
            jobs[f"w{worker}-{n}"] = (" ".join(words), int(rng.integers(3, 30)))
    got: dict[str, list[Any]] = {}
    errors: list[str] = []
    start = threading.Barrier(CLIENTS)
    threads = [threading.Thread(target=_run_stream, args=(server, w, jobs, got, errors, start))
               for w in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(got) == set(jobs) | {f"w{w}-last" for w in range(CLIENTS)}

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for rid, (prompt, max_tokens) in jobs.items():
            responses = got[rid]
            finals = [_final(r) for r in responses]
            assert finals.count(True) == 1 and finals[-1], rid  # the final flag last, once
            counts = [_count(r) for r in responses]
            assert set(counts[:-1]) <= {1} and counts[-1] in (0, 1), rid  # a token each
            assert 1 <= sum(counts) <= max_tokens
            # the same request alone, one final response: the same tokens, the same text
            client.async_stream_infer(MODEL, _inputs(prompt, max_tokens, False),
                                      request_id=f"alone-{rid}")
            result, error = answers.get(timeout=120)
            assert error is None and _final(result)
            assert _count(result) == sum(counts), rid
            assert _text(result) == "".join(_text(r) for r in responses), rid
    finally:
        client.stop_stream()
        client.close()
