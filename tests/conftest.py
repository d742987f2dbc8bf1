"""Shared fixtures: model repositories built on the fly, and real servers on loopback."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"


def _load_make_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "scripts" / "make_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_models = _load_make_models()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_EPHEMERAL = _ephemeral_range()
_handed_out: set[int] = set()


# the bundled add_sub's inputs in the e2e tests of the frontends that serve it (SageMaker,
# Vertex AI): one row of 16
ADD_SUB_DATA = np.arange(16, dtype=np.float32).reshape(1, 16)


def add_sub_body(binary_in: bool, binary_out: bool) -> tuple[bytes, int | None]:
    """A KServe inference body for add_sub as tritonclient builds it: INPUT0 as binary data
    or JSON, INPUT1 as JSON, OUTPUT0 asked for as binary data or JSON, OUTPUT1 as JSON; and
    the JSON header's size (None when nothing is binary)."""
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(ADD_SUB_DATA, binary_data=binary_in)
    inputs[1].set_data_from_numpy(ADD_SUB_DATA, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    return httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)


def free_port() -> int:
    """A loopback port free now, for a server a test starts. Taken below the kernel's
    ephemeral range: a port the kernel handed out for ``bind(0)`` is one it may give the next
    outgoing connection too (a client of another test, a stub's socket), which then holds it
    by the time the server binds ("address already in use"). Ports handed out in this process
    are not handed out again."""
    low = 20000 if _EPHEMERAL[0] > 21000 else 1024
    high = _EPHEMERAL[0] - 1 if _EPHEMERAL[0] > low + 1000 else 65535
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(low, high)
        if port in _handed_out or _EPHEMERAL[0] <= port <= _EPHEMERAL[1]:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # every try was taken: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The tests' tritonclient HTTP clients, so that stopping a server first closes the ones still
# open to it, as a client program closes its own before the server goes away. The server
# serves every connection open at its shutdown until its client closes it (Triton's HTTP
# stop), so a client a test left open would hold each stop for the whole exit timeout.
# Only the clients of the thread that stops the server: one another thread is using (a request
# left hanging on purpose) is that thread's to close.
_HTTP_CLIENTS: weakref.WeakKeyDictionary[httpclient.InferenceServerClient, int] = \
    weakref.WeakKeyDictionary()
_client_init = httpclient.InferenceServerClient.__init__


def _tracked_init(self: httpclient.InferenceServerClient, *args: object, **kwargs: object) -> None:
    _client_init(self, *args, **kwargs)
    _HTTP_CLIENTS[self] = threading.get_ident()


httpclient.InferenceServerClient.__init__ = _tracked_init  # type: ignore[method-assign]


def close_clients_of(port: int) -> None:
    """Close the tritonclient HTTP clients this thread opened to ``port`` and left open."""
    me = threading.get_ident()
    for client, thread in list(_HTTP_CLIENTS.items()):
        if thread == me and client._parsed_url.port == port:
            del _HTTP_CLIENTS[client]
            client.close()


class ServerProcess:
    """``python -m nursery serve`` in a subprocess on free loopback ports."""

    def __init__(self, repo: Path | str | list[Path | str], *extra: str, log_path: Path,
                 cwd: Path = ROOT, openai: bool = False,
                 command: Callable[[ServerProcess], list[str]] | None = None) -> None:
        """``command``: the whole command line instead of ``nursery serve``'s, made once the
        free ports are chosen (``python -m nursery openai``'s, for one)."""
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        # the OpenAI-compatible frontend (--openai-port), only when asked for
        self.openai_port = free_port() if openai else None
        repos = repo if isinstance(repo, list) else [repo]
        self.args = [sys.executable, "-m", "nursery", "serve"]
        for r in repos:
            self.args += ["--model-repository", str(r)]
        self.args += [
            "--http-address", "127.0.0.1", "--http-port", str(self.http_port),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
            *(["--openai-port", str(self.openai_port)] if self.openai_port else []),
            *extra,
        ]
        if command is not None:
            self.args = command(self)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI frontend's base URL, as the openai SDK takes it."""
        assert self.openai_port is not None, "started without openai=True"
        return f"http://127.0.0.1:{self.openai_port}/v1"

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0, path: str = "/v2/health/ready",
                   tls: ssl.SSLContext | None = None) -> None:
        """Until the HTTP port answers ``path`` with 200 (over HTTPS with ``tls``)."""
        deadline = time.monotonic() + timeout
        scheme = "https" if tls is not None else "http"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{scheme}://{self.url}{path}", timeout=2,
                                            context=tls) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            close_clients_of(self.http_port)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def wait_for_file(path: Path, timeout: float = 60.0) -> None:
    """Until ``path`` exists (a model touches it to say where it is), bounded: a test never
    waits forever."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


@contextmanager
def running_server(repo: Path | str | list[Path | str], *extra: str,
                   tmp_path_factory: pytest.TempPathFactory,
                   openai: bool = False) -> Iterator[ServerProcess]:
    """A server for a module's tests: ready on entry; on exit stopped with SIGTERM, and it
    must have exited 0 (a clean shutdown is part of every e2e module's check). ``openai``:
    with the OpenAI-compatible frontend on a free port of its own (``openai_url``)."""
    proc = ServerProcess(repo, *extra, log_path=tmp_path_factory.mktemp("log") / "server.log",
                         openai=openai)
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"server exit code {code}:\n{proc.log()}"


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[type[ServerProcess]]:
    """A factory: ``start_server(repo, *flags)`` starts one; all are stopped afterwards."""
    started: list[ServerProcess] = []

    def start(repo: Path | str | list[Path | str], *extra: str,
              wait: bool = True, openai: bool = False,
              command: Callable[[ServerProcess], list[str]] | None = None) -> ServerProcess:
        server = ServerProcess(repo, *extra, log_path=tmp_path / f"server{len(started)}.log",
                               openai=openai, command=command)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start  # type: ignore[misc]
    unclean = []
    for server in started:
        running = server.proc.poll() is None
        code = server.stop()
        if running and code != 0:  # one a test ended on purpose has exited already
            unclean.append(f"server exit code {code} after SIGTERM:\n{server.log()[-3000:]}")
    assert not unclean, "\n".join(unclean)


# A ceiling on the address space of the test run and the servers it starts (they inherit it):
# a test that allocates without bound then fails with MemoryError where it allocates, instead
# of the kernel's OOM killer taking the whole run (seen once, at 24 GB). Not on GPU machines
# (CUDA maps large virtual ranges); NURSERY_TEST_MEMORY_LIMIT_GB=0 turns it off.
MEMORY_LIMIT_GB = float(os.environ.get("NURSERY_TEST_MEMORY_LIMIT_GB", "16"))


def pytest_configure(config: pytest.Config) -> None:
    import resource

    from nursery.runtime.devices import gpu_count

    if MEMORY_LIMIT_GB <= 0 or gpu_count() > 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = int(MEMORY_LIMIT_GB * (1 << 30))
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.gpu`` tests are deselected on a machine without a GPU unless a marker
    expression is given (``pytest -m gpu`` selects exactly them, anywhere)."""
    if config.option.markexpr:
        return
    from nursery.runtime.devices import gpu_count

    if gpu_count() > 0:
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]


def _drop_bogus_module() -> None:
    """Drop the module named '' that decoding protobuf messages with the generated betterproto
    classes can leave in ``sys.modules`` (the repository root, imported as a package by the
    betterproto machinery): torch's lazy imports walk ``sys.modules`` through
    ``inspect.getmodule`` and fail on it, so torch tests (and the collection of modules that
    import torch) after such a decode would break."""
    bogus = sys.modules.get("")
    if bogus is not None and getattr(bogus, "__name__", None) == "":
        del sys.modules[""]


def pytest_collectstart(collector: pytest.Collector) -> None:
    _drop_bogus_module()  # a test module may decode protobuf at import (fuzz seeds)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _drop_bogus_module()
