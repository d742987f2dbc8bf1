"""The OpenAI frontend in process, without sockets: the model manager serves tests/models'
llm_echo with the real Python backend, and the frontend's handler is called as the HTTP server
calls it. What this depth shows that the e2e tests cannot: the request's cancel scope being
cancelled mid-stream (what the server does when the client leaves) reaches the model, and an
unexpected exception in the handler costs its request only (500 in OpenAI's shape, one count)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from nursery.actors import model_manager
from nursery.actors.directory import Directory
from nursery.core import Core
from nursery.protocol.http import http1
from nursery.protocol.http.streaming import Streaming, StreamWriter, collect
from nursery.protocol.openai.frontend import OpenAIFrontend
from nursery.settings import OpenAISettings
from tests.llm_tokenizer import write_tokenizer

MODELS = Path(__file__).resolve().parents[1] / "models"


@asynccontextmanager
async def _serving(tmp_path: Path) -> AsyncIterator[OpenAIFrontend]:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "llm_echo", repo / "llm_echo")
    tokenizer = write_tokenizer(tmp_path / "tok")
    directory = Directory()
    async with trio.open_nursery() as nursery:
        commands, inbox = trio.open_memory_channel[Any](4)
        core = Core.over(directory, commands)
        await nursery.start(partial(
            model_manager.run, repositories=(repo,), directory=directory, inbox=inbox,
            startup_models=["llm_echo"], exit_on_error=True, client=core.client))
        async with commands:
            yield OpenAIFrontend(core, OpenAISettings(tokenizer=str(tokenizer)))


def _head(path: bytes) -> http1.RequestHead:
    return http1.RequestHead(b"POST", path, b"1.1", [], None, False, True, False)


async def _completion(frontend: OpenAIFrontend, prompt: str, **extra: Any) -> Any:
    body = json.dumps({"model": "llm_echo", "prompt": prompt, **extra}).encode()
    answer = await frontend.handle(_head(b"/v1/completions"), body)
    if isinstance(answer, Streaming):
        return await collect(answer)
    return answer


async def test_cancelling_the_request_scope_mid_stream_reaches_the_model(tmp_path: Path) -> None:
    async with _serving(tmp_path) as frontend:
        body = json.dumps({"model": "llm_echo", "prompt": "forever more",
                           "stream": True}).encode()
        answer = await frontend.handle(_head(b"/v1/completions"), body)
        assert isinstance(answer, Streaming)
        events: list[bytes] = []
        with trio.CancelScope() as scope:  # the server's request scope

            async def start(status: int, headers: list[tuple[bytes, bytes]]) -> None:
                assert status == 200

            async def send(data: bytes) -> None:
                events.append(data)
                if len(events) == 3:  # the client leaves: the sweep cancels the scope
                    scope.cancel()

            await answer.run(StreamWriter(start, send))
        assert scope.cancelled_caught and len(events) >= 3
        with trio.fail_after(30):  # bounded: the model notices within one token
            while True:
                status, _, payload = await _completion(frontend, "__stats__")
                assert status == 200
                text = json.loads(payload)["choices"][0]["text"]
                if json.loads(text)["cancelled"] == 1:
                    break
                await trio.sleep(0.02)
        # the frontend and the model serve on
        status, _, payload = await _completion(frontend, "a b c", max_tokens=2)
        assert status == 200 and json.loads(payload)["choices"][0]["text"] == "a b"


async def test_an_unexpected_failure_costs_its_request_only(tmp_path: Path) -> None:
    async with _serving(tmp_path) as frontend:
        class Broken:
            def apply_chat_template(self, messages: Any, **kw: Any) -> str:
                raise RuntimeError("template engine exploded")

        good = frontend.tokenizer
        frontend.tokenizer = Broken()  # type: ignore[assignment]
        body = json.dumps({"model": "llm_echo",
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        status, headers, payload = await frontend.handle(_head(b"/v1/chat/completions"), body)  # type: ignore[misc]
        assert status == 500 and headers == [(b"content-type", b"application/json")]
        error = json.loads(payload)["error"]
        assert error["type"] == "internal_server_error"
        assert "template engine exploded" in error["message"]
        assert frontend.core.faults.snapshot() == {"openai": 1}
        frontend.tokenizer = good
        status, _, payload = await frontend.handle(_head(b"/v1/chat/completions"), body)  # type: ignore[misc]
        assert status == 200
        assert json.loads(payload)["choices"][0]["message"]["content"] == "<s>user: hi assistant:"
