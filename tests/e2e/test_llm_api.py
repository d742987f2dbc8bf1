"""The LLM doors end to end (issue 27): the OpenAI-compatible frontend driven by the official
``openai`` SDK, the generate extension by raw HTTP and its Server-Sent Events, and the KServe
side by ``tritonclient``, against the test models in tests/models (llm_echo: TRT-LLM names,
decoupled; llm_vllm: the vLLM form; llm_plain: not decoupled; llm_embed: embeddings) and a
tokenizer trained here (tests/llm_tokenizer.py)."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.conftest import ServerProcess, running_server
from tests.llm_tokenizer import write_tokenizer

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parents[1] / "models"
SEP = "_"  # also part of the models' own names: the whole name wins


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("llm")
    repo = root / "repo"
    for name in ("llm_echo", "llm_vllm", "llm_plain", "llm_embed"):
        shutil.copytree(MODELS / name, repo / name)
    tokenizer = write_tokenizer(root / "tokenizer")
    with running_server(repo, "--tokenizer", str(tokenizer), "--lora-separator", SEP,
                        tmp_path_factory=tmp_path_factory, openai=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                       timeout=60) as sdk:
        yield sdk


HELLO = [{"role": "user", "content": "hello world"}]
# the tokenizer's template renders HELLO as "<s>user: hello world\nassistant:"; llm_echo
# answers the prompt's words again, one token each
HELLO_ECHO = "<s>user: hello world assistant:"


# -- the OpenAI SDK -------------------------------------------------------------------------------

def test_models_are_listed_with_their_adapters(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list().data}
    assert {"llm_echo", "llm_vllm", "llm_plain", "llm_embed"} <= ids
    assert {f"llm_echo{SEP}sql", f"llm_echo{SEP}chat", f"llm_vllm{SEP}fr"} <= ids
    model = client.models.retrieve("llm_echo")
    assert model.id == "llm_echo" and model.owned_by == "Triton Inference Server"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no_such_model")
    assert "Unknown model: no_such_model" in str(caught.value)


def test_chat_completion(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="llm_echo", messages=HELLO)
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == HELLO_ECHO
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 4)
    assert answer.usage.total_tokens == 8


def test_chat_completion_streams_chunks_and_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="llm_echo", messages=HELLO, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == HELLO_ECHO
    pieces = [c.choices[0].delta.content for c in chunks if c.choices]
    assert len([p for p in pieces if p]) == 4  # one event per token
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_max_tokens_and_stop_reach_the_model(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_echo", prompt="a b c d e", max_tokens=2)
    assert answer.choices[0].text == "a b"
    assert answer.choices[0].finish_reason == "length"
    answer = client.completions.create(model="llm_echo", prompt="a b c d e", stop="c")
    assert answer.choices[0].text == "a b"
    answer = client.chat.completions.create(model="llm_echo", messages=HELLO,
                                            max_completion_tokens=1)
    assert answer.choices[0].message.content == "<s>user:"


def test_trtllm_tensors_carry_the_sampling_fields(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=f"llm_echo{SEP}sql", prompt="__params__", temperature=0.5, top_p=0.25, seed=7,
        max_tokens=9, stop=["x", "y"])
    seen = json.loads(answer.choices[0].text)
    assert seen["temperature"] == 0.5 and seen["top_p"] == 0.25 and seen["seed"] == 7
    assert seen["max_tokens"] == 9 and seen["stop_words"] == ["x", "y"]
    assert seen["stream"] is False and seen["return_num_input_tokens"] is True
    assert seen["parameters"] == {"lora_name": "sql"}


def test_vllm_form_carries_sampling_parameters(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=f"llm_vllm{SEP}fr", prompt="__params__", temperature=0.0, seed=1, max_tokens=3,
        echo=True)
    seen = json.loads(answer.choices[0].text)
    assert seen["sampling"] == {"temperature": 0.0, "seed": 1, "max_tokens": 3,
                                "lora_name": "fr"}
    assert seen["parameters"] == {"lora_name": "fr"}
    assert seen["exclude_input_in_output"] is False


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_vllm", prompt="one two three")
    assert answer.object == "text_completion"
    assert answer.choices[0].text == "three two one"
    assert answer.usage is not None and answer.usage.prompt_tokens == 3
    chunks = list(client.completions.create(model="llm_vllm", prompt="one two three",
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "three two one"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_logprobs_where_the_model_returns_them(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_vllm", prompt="a b", logprobs=1)
    assert answer.choices[0].logprobs is not None
    assert answer.choices[0].logprobs.tokens == ["b", "a"]
    assert answer.choices[0].logprobs.token_logprobs == [-0.5, -0.5]
    chat = client.chat.completions.create(model="llm_vllm", messages=HELLO, logprobs=True,
                                          top_logprobs=2)
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and content[0].logprob == -0.5 and len(content[0].top_logprobs) == 2
    with pytest.raises(openai.BadRequestError) as caught:  # llm_echo has no logprobs output
        client.completions.create(model="llm_echo", prompt="a", logprobs=1)
    assert "logprobs are currently available only" in str(caught.value)


def test_n_choices(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_echo", prompt="x y z", n=3, seed=5)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert {c.text for c in answer.choices} == {"x y z"}
    chunks = list(client.chat.completions.create(model="llm_echo", messages=HELLO, n=2,
                                                 stream=True))
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices and c.choices[0].index == index)
        assert text == HELLO_ECHO


def test_non_decoupled_model(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm_plain", prompt="quiet words here",
                                       max_tokens=2)
    assert answer.choices[0].text == "QUIET WORDS"
    # no counts from the model: the tokenizer counts
    assert answer.usage is not None and answer.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="llm_plain", prompt="x", stream=True)
    assert "cannot stream" in str(caught.value)


def test_embeddings(client: openai.OpenAI) -> None:
    got = client.embeddings.create(model="llm_embed", input="hello world")
    assert got.data[0].embedding == [11.0, 2.0, 3.0, 1.0]
    assert got.usage.prompt_tokens == 2
    got = client.embeddings.create(model="llm_embed", input=["ab", "hello world"],
                                   dimensions=2)
    assert [d.embedding for d in got.data] == [[2.0, 1.0], [11.0, 2.0]]
    raw = client.embeddings.with_raw_response.create(model="llm_embed", input="abc",
                                                     encoding_format="base64")
    vector = base64.b64decode(json.loads(raw.text)["data"][0]["embedding"])
    assert np.frombuffer(vector, dtype=np.float32).tolist() == [3.0, 1.0, 1.0, 1.0]
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="llm_echo", input="x")
    assert "embedding_request" in str(caught.value)


def test_bad_requests_get_openai_shaped_errors(client: openai.OpenAI) -> None:
    # an unknown model is a client error (400), as Triton's frontend answers it; the message
    # also under "detail", where Triton's frontend puts it
    with pytest.raises(openai.BadRequestError) as nf:
        client.chat.completions.create(model="no_such_model", messages=HELLO)
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert nf.value.response.json()["detail"] == "Unknown model: no_such_model"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=f"llm_echo{SEP}nope", prompt="x")
    assert f"Unknown LoRA: nope; for model: llm_echo{SEP}nope" in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="llm_echo", prompt="x", max_tokens=0)
    assert caught.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="llm_echo", prompt="x",
                                  temperature="hot")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="llm_echo", messages=HELLO,
                                       stream_options={"include_usage": True})
    assert "stream_options" in str(caught.value)
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="llm_echo",
                                       messages=[{"role": "robot", "content": "x"}])
    assert "unknown role robot" in str(failed.value)
    with pytest.raises(openai.InternalServerError) as failed:
        client.completions.create(model="llm_echo", prompt="__fail__")
    assert "the model was asked to fail" in str(failed.value)
    with pytest.raises(openai.InternalServerError):  # failing before the first event
        client.completions.create(model="llm_echo", prompt="__fail__", stream=True)


def test_an_error_after_the_first_event_is_an_event(client: openai.OpenAI) -> None:
    stream = client.completions.create(model="llm_echo", prompt="__fail_late__", stream=True)
    texts: list[str] = []

    def read_all() -> None:
        texts.extend(chunk.choices[0].text for chunk in stream)

    with stream, pytest.raises(openai.APIError) as caught:
        read_all()
    assert texts == ["one"]
    assert "failed after its first token" in str(caught.value)


def _post(server: ServerProcess, port: int, path: str, body: bytes,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body, {"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_malformed_json_and_unknown_routes(server: ServerProcess) -> None:
    assert server.openai_port is not None
    status, headers, body = _post(server, server.openai_port, "/v1/chat/completions", b"{oops")
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "invalid_json"
    status, _, body = _post(server, server.openai_port, "/v1/nothing", b"{}")
    assert status == 404 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, _, body = _post(server, server.openai_port, "/v1/completions",
                            b'{"model": "llm_echo"}')
    assert status == 400 and json.loads(body)["error"]["message"] == "prompt must be non-empty"


def _cancelled(client: openai.OpenAI) -> int:
    answer = client.completions.create(model="llm_echo", prompt="__stats__")
    return int(json.loads(answer.choices[0].text)["cancelled"])


def _wait_cancelled(client: openai.OpenAI, more_than: int) -> int:
    deadline = time.monotonic() + 30  # bounded wait for the model to notice, not a timing
    while time.monotonic() < deadline:
        now = _cancelled(client)
        if now > more_than:
            return now
        time.sleep(0.05)
    raise AssertionError("the model never saw its request cancelled")


def _read_events(sock: socket.socket, count: int) -> bytes:
    data = b""
    while data.count(b"data: ") < count:
        piece = sock.recv(4096)
        assert piece, data
        data += piece
    return data


def test_a_client_leaving_mid_stream_cancels_its_generation(
        server: ServerProcess, client: openai.OpenAI) -> None:
    """The OpenAI port and the generate_stream route: a client that closes its connection
    mid-stream cancels the request (the model sees ``is_cancelled()``); the server goes on."""
    before = _cancelled(client)
    assert server.openai_port is not None
    for port, path, body in (
        (server.openai_port, "/v1/completions",
         {"model": "llm_echo", "prompt": "forever and ever", "stream": True}),
        (server.http_port, "/v2/models/llm_echo/generate_stream",
         {"text_input": "forever and ever", "stream": True}),
    ):
        payload = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\ncontent-length: "
                         + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            _read_events(sock, 3)
        before = _wait_cancelled(client, before)
    answer = client.chat.completions.create(model="llm_echo", messages=HELLO)
    assert answer.choices[0].message.content == HELLO_ECHO


# -- the generate extension (raw HTTP, Server-Sent Events) -------------------------------------

def _events(body: bytes) -> list[dict[str, object]]:
    text = body.decode()
    assert text.endswith("\n\n") or not text
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), text
    return [json.loads(e[len("data: "):]) for e in events]


def test_generate(server: ServerProcess) -> None:
    status, headers, body = _post(server, server.http_port, "/v2/models/llm_echo/generate",
                                  b'{"id": "42", "text_input": "a b c", "max_tokens": 2}')
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"id": "42", "model_name": "llm_echo", "model_version": "1",
                                "text_output": "a b", "num_input_tokens": 3,
                                "num_output_tokens": 2}
    status, _, body = _post(server, server.http_port, "/v2/models/llm_plain/generate",
                            b'{"text_input": "x y", "parameters": {"max_tokens": 1}}')
    assert status == 200 and json.loads(body)["text_output"] == "X"
    assert "id" not in json.loads(body)
    # more than one response: /generate refuses, as Triton does (with the 200 it has sent)
    status, _, body = _post(server, server.http_port, "/v2/models/llm_echo/generate",
                            b'{"text_input": "a b c", "stream": true}')
    assert status == 200 and json.loads(body) == {"error": (
        "generate expects model to produce exactly 1 response, use generate stream for "
        "model that generates various number of responses")}


def test_generate_stream(server: ServerProcess) -> None:
    status, headers, body = _post(
        server, server.http_port, "/v2/models/llm_echo/generate_stream",
        b'{"text_input": "a b c", "stream": true, "parameters": {"lora": "x"}}')
    assert status == 200
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    events = _events(body)
    assert [e["text_output"] for e in events] == ["a", " b", " c"]
    assert b"[DONE]" not in body
    # a non-decoupled model: one event
    status, _, body = _post(server, server.http_port, "/v2/models/llm_plain/generate_stream",
                            b'{"text_input": "x y"}')
    assert status == 200 and [e["text_output"] for e in _events(body)] == ["X Y"]
    # an error after the first response is an event; the status stays 200
    status, _, body = _post(server, server.http_port, "/v2/models/llm_echo/generate_stream",
                            b'{"text_input": "__fail_late__", "stream": true}')
    events = _events(body)
    assert status == 200 and events[0]["text_output"] == "one"
    assert events[1] == {"error": "the model failed after its first token"}
    # an error as the first response sets the status
    status, headers, body = _post(server, server.http_port,
                                  "/v2/models/llm_echo/generate_stream",
                                  b'{"text_input": "__fail__"}')
    assert status == 500 and _events(body) == [{"error": "the model was asked to fail"}]


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"text_input": "a", "text_input": "b"}', 400, "input 'text_input' already exists in request"),
    (b'{"text_input": "a", "parameters": {"text_input": "b"}}', 400,
     "Converting keyword: 'parameters': input 'text_input' already exists in request"),
    (b'{"text_input": "a", "x": 1, "parameters": {"x": 2}}', 400,
     "parameter 'x' already exists in request"),
    (b'{"text_input": "a", "parameters": 1}', 400, "Expected JSON object for keyword: 'parameters'"),
    (b'{"text_input": "a", "p": {"q": 1}}', 400, "parameter 'p' has invalid type"),
    (b'{"text_input": 5}', 500, "attempt to access JSON non-string as string"),
    (b'{"text_input": "a", "stream": "yes"}', 500, "attempt to access JSON non-boolean as boolean"),
    (b'{"stream": true}', 400, "missing required input(s) ['text_input']"),
    (b'{"text_input": ', 500, "failed to parse the request JSON buffer"),
])
def test_generate_refuses_bad_requests(server: ServerProcess, body: bytes, status: int,
                                       message: str) -> None:
    for route in ("generate", "generate_stream"):
        got, headers, answer = _post(server, server.http_port,
                                     f"/v2/models/llm_echo/{route}", body)
        assert (got, headers["content-type"]) == (status, "application/json"), answer
        assert message in json.loads(answer)["error"]


def test_generate_refuses_compressed_bodies_and_unknown_models(server: ServerProcess) -> None:
    got, _, answer = _post(server, server.http_port, "/v2/models/llm_echo/generate",
                           b"\x1f\x8b", {"content-encoding": "gzip"})
    assert got == 400
    assert json.loads(answer)["error"] == ("Unsupported content-encoding, only 'identity' is "
                                           "supported.")
    got, _, answer = _post(server, server.http_port, "/v2/models/nope/generate_stream", b"{}")
    assert got == 404


# -- the KServe side with tritonclient --------------------------------------------------------

def test_tritonclient_reaches_the_same_models(server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http_client = httpclient.InferenceServerClient(server.url)
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"kserve side"], dtype=object))
    result = http_client.infer("llm_plain", [text])
    assert result.as_numpy("text_output").tolist() == [b"KSERVE SIDE"]
    http_client.close()

    got: list[object] = []
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    grpc_client.start_stream(callback=lambda result, error: got.append(error or result))
    prompt = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    prompt.set_data_from_numpy(np.array([[b"p q r"]], dtype=object))
    stream = grpcclient.InferInput("stream", [1, 1], "BOOL")
    stream.set_data_from_numpy(np.array([[True]]))
    grpc_client.async_stream_infer("llm_echo", [prompt, stream], enable_empty_final_response=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            getattr(r, "get_response", None) and r.get_response().parameters  # type: ignore[attr-defined]
            .get("triton_final_response") and r.get_response().parameters[  # type: ignore[attr-defined]
                "triton_final_response"].bool_param for r in got):
        time.sleep(0.02)
    grpc_client.stop_stream()
    grpc_client.close()
    texts = [r.as_numpy("text_output") for r in got  # type: ignore[attr-defined]
             if not isinstance(r, Exception) and r.as_numpy("text_output") is not None]  # type: ignore[attr-defined]
    assert [t.reshape(-1)[0] for t in texts] == [b"p", b" q", b" r"]


def test_generate_wants_post(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("GET", "/v2/models/llm_echo/generate")
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (405, {"error": "Method Not Allowed"})
    conn.close()


# -- without --tokenizer ------------------------------------------------------------------------

def test_each_model_may_bring_its_own_tokenizer(tmp_path: Path, start_server: type) -> None:
    """Without --tokenizer, a model's <model>/tokenizer/ folder serves its chats; a model with
    none answers chat 500 "Unknown tokenizer" (Triton's frontend) and completions still work."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "llm_echo", repo / "llm_echo")
    shutil.copytree(MODELS / "llm_plain", repo / "llm_plain")
    write_tokenizer(repo / "llm_echo" / "tokenizer")
    proc = start_server(repo, openai=True)
    with openai.OpenAI(base_url=proc.openai_url, api_key="unused", max_retries=0) as client:
        answer = client.chat.completions.create(model="llm_echo", messages=HELLO)
        assert answer.choices[0].message.content == HELLO_ECHO
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="llm_plain", messages=HELLO)
        assert "Unknown tokenizer" in str(caught.value)
        answer = client.completions.create(model="llm_plain", prompt="still works")
        assert answer.choices[0].text == "STILL WORKS" and answer.usage is None


def test_a_tokenizer_folder_that_cannot_be_read_stops_the_start(
        tmp_path: Path, start_server: type) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "llm_plain", repo / "llm_plain")
    (tmp_path / "empty").mkdir()
    proc = start_server(repo, "--tokenizer", str(tmp_path / "empty"), openai=True, wait=False)
    assert proc.wait_exit() != 0
    assert "--tokenizer: no tokenizer.json in the tokenizer folder" in proc.log()


def test_a_body_past_the_limit_is_refused_unread(server: ServerProcess) -> None:
    assert server.openai_port is not None
    with socket.create_connection(("127.0.0.1", server.openai_port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: 100000000\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            piece = sock.recv(4096)
            if not piece:
                break
            answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    error = json.loads(body)["error"]
    assert error["code"] == "content_too_large"
    assert error["message"].startswith("Request size of 100000000 bytes exceeds the maximum")


def test_an_http_1_0_stream_ends_with_the_close(server: ServerProcess) -> None:
    payload = b'{"text_input": "a b", "stream": true}'
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v2/models/llm_echo/generate_stream HTTP/1.0\r\ncontent-length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        answer = b""
        while piece := sock.recv(4096):
            answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding" not in head.lower()
    assert [e["text_output"] for e in _events(body)] == ["a", " b"]
