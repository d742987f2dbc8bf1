"""``nursery.Server``: the whole server inside another program.

``Server(model_repository=..., **flags)`` parses its keyword arguments as Triton's command
line (``model_control_mode="explicit"`` is ``--model-control-mode=explicit``; a list repeats
the flag), then runs ``trio.run(server.serve, ...)`` on a thread of its own: the same root
nursery, actors and supervision tree as ``python -m nursery serve``, with no port open unless
asked for (``allow_http=True``, or ``serve_http(port=...)`` later) and no signal handling
(signals belong to the host program). Calls from the host reach the server's trio thread
through its trio token: a plain thread blocks on a queue, a trio or asyncio caller awaits an
event of its own loop, so that no thread is held per call; cancelling an awaiting caller
cancels its request.

``bind`` serves a Python function as a model (``backends/callable.py``): its generated
``config.pbtxt`` is written into a private repository that the server reads beside the
caller's, and the model is loaded like any other.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import logging
import math
import os
import queue
import shutil
import tempfile
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import outcome
import sniffio
import trio

from nursery.backends.callable import BACKEND, Binding, CallableFactory, call_style
from nursery.config.json_form import ConfigJsonError, config_from_json
from nursery.config.storage.url import CloudRoot
from nursery.core import Core
from nursery.embed.binding import DynamicBatcher, Tensor, config_text
from nursery.errors import (
    AlreadyExists,
    Cancelled,
    InvalidArgument,
    NurseryError,
    StartupError,
    Unavailable,
    first_error,
)
from nursery.messages import Part
from nursery.observability.custom_metrics import CustomMetrics
from nursery.observability.logs import LogManager, LogSettings
from nursery.protocol.codecs import stats as stats_codec
from nursery.protocol.http.metrics import metrics_text
from nursery.server import Running, serve
from nursery.settings import Settings, settings_from_args
from nursery.types import DataType, InferenceRequest, RequestedOutput, tensor_of

log = logging.getLogger("nursery.embed")

CLOSED = "the nursery.Server is closed"

# repositories served by a Server of this process: path or URL -> that server
_CLAIMS: dict[str, weakref.ref[Server]] = {}
_CLAIMS_LOCK = threading.Lock()
_OPEN: weakref.WeakSet[Server] = weakref.WeakSet()

# flags whose presence makes the server own the process's logging (observability/logs.py)
_LOG_FLAGS = ("log_verbose", "log_info", "log_warning", "log_error", "log_file", "log_format")
# ports stay closed unless asked for
_CLOSED_PORTS = {"allow_http": False, "allow_grpc": False, "allow_metrics": False}


def _argv(flags: Mapping[str, Any]) -> list[str]:
    """Keyword arguments as Triton's command line."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, os.PathLike):
                v = os.fspath(v)
            argv.append(f"{flag}={v}")
    return argv


def _claim_key(root: Path | CloudRoot) -> str:
    return str(root) if isinstance(root, Path) else repr(root)


@dataclass
class _Holder:
    scope: trio.CancelScope | None = None
    cancelled: bool = False


class _Relay:
    """An inbox that hands each item to a function, on the server's thread."""

    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.put = deliver


class _Inbox:
    """Where answers from the server's thread arrive, in the caller's world: a plain
    thread's queue, or an event of the caller's trio or asyncio loop. ``put`` is called on
    the server's trio thread and never blocks."""

    def __init__(self, library: str | None) -> None:
        self.library = library
        if library == "trio":
            self._token = trio.lowlevel.current_trio_token()
            self._send, self._receive = trio.open_memory_channel[Any](math.inf)
        elif library == "asyncio":
            self._loop = asyncio.get_running_loop()
            self._queue: asyncio.Queue[Any] = asyncio.Queue()
        else:
            self._plain: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        try:
            if self.library == "trio":
                self._token.run_sync_soon(self._send.send_nowait, item)
            elif self.library == "asyncio":
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
            else:
                self._plain.put(item)
        except (trio.RunFinishedError, RuntimeError):
            pass  # the caller's loop has ended: nobody waits

    def get(self) -> Any:
        return self._plain.get()

    async def aget(self) -> Any:
        if self.library == "trio":
            return await self._receive.receive()
        return await self._queue.get()


class Server:
    """An in-process nursery server; see the module's documentation and docs/embedding.md.

    ``with Server(model_repository="models") as server: server.infer("mlp", {...})``
    """

    def __init__(self, model_repository: str | os.PathLike[str] | Sequence[Any] | None = None,
                 *, exclusive: bool = True, custom_metrics: CustomMetrics | None = None,
                 sample_metrics: bool = False, **flags: Any) -> None:
        self._closed = True  # until started
        repos = model_repository
        if repos is None:
            repo_list: list[Any] = []
        elif isinstance(repos, (str, os.PathLike)):
            repo_list = [repos]
        else:
            repo_list = list(repos)
        self._private = Path(tempfile.mkdtemp(prefix="nursery-bound-"))
        try:
            argv = _argv({"model_repository": [*repo_list, self._private],
                          **{k: v for k, v in _CLOSED_PORTS.items() if k not in flags},
                          **flags})
            self.settings: Settings = settings_from_args(argv, prog="nursery.Server",
                                                         raise_errors=True)
            if sample_metrics:  # the figures the metrics port shows, without the port
                self.settings = dataclasses.replace(self.settings, allow_metrics=True,
                                                    open_metrics_port=False)
        except BaseException:
            shutil.rmtree(self._private, ignore_errors=True)
            raise
        self._factory = CallableFactory()
        self._custom_metrics = custom_metrics
        self._claims: list[str] = []
        if exclusive:
            self._claim(self.settings.model_repositories[:-1])
        self._log_manager: LogManager | None = None
        if any(k in flags for k in _LOG_FLAGS):
            s = self.settings
            try:
                self._log_manager = LogManager(LogSettings(
                    log_file=s.log_file, log_info=s.log_info, log_warning=s.log_warning,
                    log_error=s.log_error, log_verbose_level=s.log_verbose,
                    log_format=s.log_format, escape=s.log_escape))
            except OSError as exc:
                self._release()
                raise ValueError(f"--log-file: cannot open '{s.log_file}': {exc}") from None
        self._running: Running | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._calls: trio.Nursery | None = None
        self._fronts: trio.Nursery | None = None
        self._stop_event: trio.Event | None = None
        self._front_stop: trio.Event | None = None
        self._accepting = False  # on the server's thread: new calls are taken
        self._start_error: BaseException | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="nursery-server",
                                        daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            self._release()
            error = first_error(self._start_error)
            if isinstance(error, StartupError):
                raise StartupError(f"creating server: {error}") from None
            raise error
        self._closed = False
        _OPEN.add(self)

    # -- life ------------------------------------------------------------------------------

    def _claim(self, roots: Sequence[Path | CloudRoot]) -> None:
        with _CLAIMS_LOCK:
            for root in roots:
                key = _claim_key(root)
                other = _CLAIMS.get(key)
                if other is not None and other() is not None and not other()._closed:  # type: ignore[union-attr]
                    self._release_locked()
                    shutil.rmtree(self._private, ignore_errors=True)
                    raise AlreadyExists(
                        f"model repository '{root}' is already served by another "
                        "nursery.Server in this process; close that one first, or give this "
                        "one another repository")
                _CLAIMS[key] = weakref.ref(self)
                self._claims.append(key)

    def _release_locked(self) -> None:
        for key in self._claims:
            ref = _CLAIMS.get(key)
            if ref is not None and ref() is self:
                del _CLAIMS[key]
        self._claims = []

    def _release(self) -> None:
        with _CLAIMS_LOCK:
            self._release_locked()
        shutil.rmtree(self._private, ignore_errors=True)

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            if not self._started.is_set():
                self._start_error = exc
            else:
                log.error("the in-process server stopped: %r", exc)
        finally:
            self._started.set()

    async def _main(self) -> None:
        self._stop_event = trio.Event()
        self._front_stop = trio.Event()
        exit_timeout = self.settings.exit_timeout_secs
        async with trio.open_nursery() as root:
            running: Running = await root.start(partial(
                serve, self.settings, handle_signals=False, log_manager=self._log_manager,
                backends={BACKEND: self._factory}, settle=False,
                custom_metrics=self._custom_metrics))
            self._running = running
            async with trio.open_nursery() as calls:
                self._calls = calls
                async with trio.open_nursery() as fronts:
                    self._fronts = fronts
                    self._token = trio.lowlevel.current_trio_token()
                    self._accepting = True
                    self._started.set()
                    await self._stop_event.wait()
                    self._accepting = False
                    self._front_stop.set()  # frontends started later drain first
                    fronts.cancel_scope.deadline = trio.current_time() + exit_timeout
                running.shutdown.set()  # then the server's own: frontends, then models
                # calls in flight are answered by the models' drain
                calls.cancel_scope.deadline = trio.current_time() + 2 * exit_timeout + 1

    def close(self) -> None:
        """Stop taking calls, let the frontends started on it drain, then drain and unload
        every model (bounded by ``exit_timeout_secs``) and end the server's thread."""
        if self._closed:
            return
        self._closed = True
        if threading.current_thread() is self._thread:
            raise RuntimeError("close() was called from the server's own thread")
        token, stop = self._token, self._stop_event
        if token is not None and stop is not None:
            try:
                token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join()
        self._release()
        _OPEN.discard(self)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the bridge ------------------------------------------------------------------------

    def _spawn(self, async_fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
               inbox: _Inbox | _Relay) -> _Holder:
        """Run ``async_fn(*args)`` on the server's thread; its outcome goes to ``inbox``."""
        if self._closed or self._token is None:
            raise Unavailable(CLOSED)
        holder = _Holder()

        def start() -> None:
            if not self._accepting or self._calls is None:
                inbox.put(outcome.Error(Unavailable(CLOSED)))
                return
            self._calls.start_soon(self._run_call, async_fn, args, inbox, holder)

        try:
            self._token.run_sync_soon(start)
        except trio.RunFinishedError:
            raise Unavailable(CLOSED) from None
        return holder

    async def _run_call(self, async_fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                        inbox: _Inbox | _Relay, holder: _Holder) -> None:
        result: outcome.Outcome[Any] = outcome.Error(Unavailable(CLOSED))
        try:
            with trio.CancelScope() as scope:
                holder.scope = scope
                if holder.cancelled:
                    scope.cancel()
                result = outcome.Value(await async_fn(*args))
            if scope.cancelled_caught:
                result = outcome.Error(Cancelled("the request was cancelled"))
        except Exception as exc:
            result = outcome.Error(exc)
        finally:
            inbox.put(result)

    def _cancel(self, holder: _Holder) -> None:
        def cancel() -> None:
            holder.cancelled = True
            if holder.scope is not None:
                holder.scope.cancel()

        if self._token is not None:
            try:
                self._token.run_sync_soon(cancel)
            except trio.RunFinishedError:
                pass

    def _library(self) -> str | None:
        try:
            return sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return None

    def _call(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Blocking: from a plain thread (or, blocking its loop, from async code)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking nursery.Server call from the server's own thread "
                               "would never return")
        inbox = _Inbox(None)
        holder = self._spawn(async_fn, args, inbox)
        try:
            result = inbox.get()
        except BaseException:  # KeyboardInterrupt: the host's; the request is cancelled
            self._cancel(holder)
            raise
        return result.unwrap()

    async def _acall(self, async_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """From a trio or asyncio caller: awaits an event of the caller's own loop."""
        library = self._library()
        if library not in ("trio", "asyncio"):
            raise RuntimeError(f"nursery.Server's async calls run under trio or asyncio, "
                               f"not {library}")
        inbox = _Inbox(library)
        holder = self._spawn(async_fn, args, inbox)
        try:
            result = await inbox.aget()
        except BaseException:  # cancelled: so is the request
            self._cancel(holder)
            raise
        return result.unwrap()

    @property
    def _core(self) -> Core:
        if self._running is None:
            raise Unavailable(CLOSED)
        return self._running.core

    # -- inference -------------------------------------------------------------------------

    def _request(self, model: str, inputs: Mapping[str, Any], version: str | int,
                 outputs: Sequence[str] | None, parameters: Mapping[str, Any] | None,
                 request_id: str, priority: int, timeout_us: int) -> InferenceRequest:
        tensors = {}
        for name, value in inputs.items():
            array = np.asarray(value)
            if array.dtype.kind in ("S", "U"):
                array = np.array([v.encode() if isinstance(v, str) else v
                                  for v in array.reshape(-1).tolist()],
                                 dtype=object).reshape(array.shape)
            try:
                tensors[name] = tensor_of(name, array)
            except NurseryError as exc:
                raise InvalidArgument(f"input '{name}': {exc.message}") from None
        return InferenceRequest(
            model_name=model, model_version=str(version or ""), inputs=tensors,
            requested_outputs=tuple([RequestedOutput(o) for o in (outputs or ())]),
            id=request_id, parameters=dict(parameters or {}), priority=priority,
            timeout_us=timeout_us)

    async def _infer(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        core = self._core
        handle = await core.acquire(request.model_name, request.model_version)
        if handle.config.decoupled:
            raise InvalidArgument(
                f"model '{handle.name}' uses the decoupled transaction policy: use "
                "stream() / astream() for its responses")
        return _arrays(await core.infer(request, handle))

    def infer(self, model: str, inputs: Mapping[str, Any], *, version: str | int = "",
              outputs: Sequence[str] | None = None,
              parameters: Mapping[str, Any] | None = None, request_id: str = "",
              priority: int = 0, timeout_us: int = 0) -> dict[str, np.ndarray]:
        """One inference: the outputs by name (BYTES as object arrays of ``bytes``); a
        refusal or failure raises nursery's error with Triton's message."""
        request = self._request(model, inputs, version, outputs, parameters, request_id,
                                priority, timeout_us)
        return self._call(self._infer, request)  # type: ignore[no-any-return]

    async def ainfer(self, model: str, inputs: Mapping[str, Any], *, version: str | int = "",
                     outputs: Sequence[str] | None = None,
                     parameters: Mapping[str, Any] | None = None, request_id: str = "",
                     priority: int = 0, timeout_us: int = 0) -> dict[str, np.ndarray]:
        """:meth:`infer` for trio and asyncio callers."""
        request = self._request(model, inputs, version, outputs, parameters, request_id,
                                priority, timeout_us)
        return await self._acall(self._infer, request)  # type: ignore[no-any-return]

    async def _stream(self, request: InferenceRequest, inbox: _Inbox | _Relay) -> None:
        core = self._core
        handle = await core.acquire(request.model_name, request.model_version)
        del handle  # resolved (and loaded on demand) before the stream starts

        async def on_part(part: Part) -> None:
            inbox.put(part)

        await core.client.stream(request, on_part)

    def stream(self, model: str, inputs: Mapping[str, Any], *, version: str | int = "",
               outputs: Sequence[str] | None = None,
               parameters: Mapping[str, Any] | None = None,
               request_id: str = "") -> Iterator[dict[str, np.ndarray]]:
        """Every response of one request to a decoupled model, as it is sent (a model that
        is not decoupled yields its one response). An error response raises; leaving the
        loop early cancels the request."""
        request = self._request(model, inputs, version, outputs, parameters, request_id, 0, 0)
        inbox = _Inbox(None)
        holder = self._spawn(self._stream, (request, inbox), inbox)
        finished = False
        try:
            while True:
                item = inbox.get()
                finished = not isinstance(item, Part)
                arrays = _streamed(item)
                if finished:
                    return
                if arrays is not None:
                    yield arrays
        finally:
            if not finished:
                self._cancel(holder)

    async def astream(self, model: str, inputs: Mapping[str, Any], *,
                      version: str | int = "", outputs: Sequence[str] | None = None,
                      parameters: Mapping[str, Any] | None = None,
                      request_id: str = "") -> AsyncIterator[dict[str, np.ndarray]]:
        """:meth:`stream` for trio and asyncio callers."""
        library = self._library()
        if library not in ("trio", "asyncio"):
            raise RuntimeError(f"nursery.Server's async calls run under trio or asyncio, "
                               f"not {library}")
        request = self._request(model, inputs, version, outputs, parameters, request_id, 0, 0)
        inbox = _Inbox(library)
        holder = self._spawn(self._stream, (request, inbox), inbox)
        finished = False
        try:
            while True:
                item = await inbox.aget()
                finished = not isinstance(item, Part)
                arrays = _streamed(item)
                if finished:
                    return
                if arrays is not None:
                    yield arrays
        finally:
            if not finished:
                self._cancel(holder)

    def submit_stream(self, request: InferenceRequest,
                      deliver: Callable[[Any], None]) -> Callable[[], None]:
        """Start one request now (any model, decoupled or not); ``deliver`` is called on the
        server's thread with each :class:`~nursery.messages.Part` of its answer as it comes
        (the last one ``final``), then once with the call's outcome (``outcome.Value`` or,
        when it failed before answering, ``outcome.Error``). It must not block. Returns the
        function that cancels the request. The face the ``tritonserver`` package is built
        on."""
        relay = _Relay(deliver)
        return partial(self._cancel, self._spawn(self._stream, (request, relay), relay))

    # -- health, metadata, statistics ------------------------------------------------------

    def live(self) -> bool:
        return not self._closed and self._call(self._live)  # type: ignore[no-any-return]

    async def _live(self) -> bool:
        return self._core.server_live()

    def ready(self) -> bool:
        """Triton's server readiness (every model ready, with ``strict_readiness``)."""
        return not self._closed and self._call(self._ready)  # type: ignore[no-any-return]

    async def _ready(self) -> bool:
        return await self._core.server_ready()

    def model_ready(self, model: str, version: str | int = "") -> bool:
        async def ready() -> bool:
            return await self._core.model_ready(model, str(version or ""))
        return self._call(ready)  # type: ignore[no-any-return]

    def model_metadata(self, model: str, version: str | int = "") -> dict[str, Any]:
        async def metadata() -> dict[str, Any]:
            return self._core.model_metadata(model, str(version or ""))
        return self._call(metadata)  # type: ignore[no-any-return]

    def model_config(self, model: str, version: str | int = "") -> dict[str, Any]:
        """The model's complete configuration, as Triton's ``/config`` JSON."""
        async def config() -> dict[str, Any]:
            return self._core.model_config(model, str(version or ""))
        return self._call(config)  # type: ignore[no-any-return]

    def server_metadata(self) -> dict[str, Any]:
        async def metadata() -> dict[str, Any]:
            return self._core.server_metadata()
        return self._call(metadata)  # type: ignore[no-any-return]

    def statistics(self, model: str = "", version: str | int = "") -> dict[str, Any]:
        """Triton's statistics extension answer (``{"model_stats": [...]}``)."""
        async def stats() -> dict[str, Any]:
            entries = await self._core.model_statistics(model, str(version or ""))
            return stats_codec.to_json(entries)  # type: ignore[no-any-return]
        return self._call(stats)  # type: ignore[no-any-return]

    def repository_index(self, ready: bool = False) -> list[dict[str, Any]]:
        """The repository index: name, version, state, reason of every model."""
        async def index() -> list[dict[str, Any]]:
            return [e.as_json() for e in await self._core.repository_index(ready)]
        return self._call(index)  # type: ignore[no-any-return]

    def metrics_text(self) -> str:
        """One scrape of the server's metrics, Prometheus text (what the metrics port
        answers, without opening one)."""
        async def scrape() -> str:
            running = self._running
            if running is None or running.frontends is None:
                raise Unavailable(CLOSED)
            fronts = running.frontends
            text = metrics_text(fronts.core, fronts.sampler, fronts.options)
            return (await text()).decode()
        return self._call(scrape)  # type: ignore[no-any-return]

    # -- the repository --------------------------------------------------------------------

    def load(self, model: str, *, config: Mapping[str, Any] | str | None = None,
             files: Mapping[str, bytes] | None = None) -> None:
        """Load or reload ``model`` (explicit mode, as the repository API): ``config``
        overrides its configuration (Triton's JSON form, as a dict or a string), ``files``
        ("<version>/<path>" -> content, with ``allow_model_file_upload``) its files."""
        override = None
        if config is not None:
            text = config if isinstance(config, str) else json.dumps(config)
            try:
                override = config_from_json(text)
            except ConfigJsonError as exc:
                raise InvalidArgument(f"failed to parse the 'config' override: {exc}") from None
        if files is not None and not files:
            files = None

        async def load() -> None:
            await self._core.load_model(model, override, dict(files) if files else None)
        self._call(load)

    def register_repository(self, path: str | os.PathLike[str],
                            names: Mapping[str, str] | None = None) -> None:
        """Serve one more model repository (explicit mode, as Triton's registration), its
        folders ``names`` maps (folder -> model name) serving under those names."""
        pairs = tuple((str(folder), str(name)) for folder, name in (names or {}).items())

        async def register() -> None:
            await self._core.register_repository(Path(path), pairs)
        self._call(register)

    def unregister_repository(self, path: str | os.PathLike[str]) -> None:
        async def unregister() -> None:
            await self._core.unregister_repository(Path(path))
        self._call(unregister)

    def unload(self, model: str, *, unload_dependents: bool = False) -> None:
        async def unload() -> None:
            await self._core.unload_model(model, unload_dependents)
        self._call(unload)

    # -- Python functions as models --------------------------------------------------------

    def bind(self, model: str, fn: Callable[..., Mapping[str, Any]], *,
             inputs: Sequence[Tensor], outputs: Sequence[Tensor], max_batch_size: int = 0,
             batching: DynamicBatcher | bool | None = None, instances: int = 1,
             response_cache: bool = False, pass_as: str | None = None) -> None:
        """Serve ``fn`` as the model ``model`` (PyTriton's ``triton.bind``): it is called on
        an instance thread with the batch's inputs as numpy arrays (``fn(**inputs)``, or
        ``fn(inputs)`` for a function of one parameter not named after an input, or as
        ``pass_as`` says: "kwargs" or "dict") and returns a dict of output name to array,
        each with the batch's rows first when ``max_batch_size`` > 0. The model gets a
        generated configuration (``batching``: the dynamic batcher, ``True`` for its
        defaults), which the server completes and validates as any; a bad one raises with
        the load's message. It then serves like a repository model: batching, statistics,
        metrics, every frontend."""
        if self._closed:
            raise Unavailable(CLOSED)
        if not callable(fn):
            raise ValueError(f"model '{model}': fn must be callable, got {type(fn).__name__}")
        if pass_as not in (None, "kwargs", "dict"):
            raise ValueError("pass_as must be 'kwargs' or 'dict'")
        if not model or "/" in model or model in (".", ".."):
            raise ValueError(f"'{model}' is not a model name")
        text = config_text(model, inputs, outputs, max_batch_size=max_batch_size,
                           batching=batching, instances=instances,
                           response_cache=response_cache)
        folder = self._private / model
        if self._factory.bound(model):
            raise AlreadyExists(f"a function is already bound to model '{model}'; unbind it "
                                "first")
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(text)
        style = pass_as or call_style(fn, [t.name for t in inputs])
        self._factory.bind(model, Binding(fn, style))

        async def load() -> None:
            await self._core.load_model(model, any_mode=True)
        try:
            self._call(load)
        except BaseException:
            self._factory.unbind(model)
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def unbind(self, model: str) -> None:
        """Unload a bound function's model and forget the function."""
        if not self._factory.bound(model):
            raise InvalidArgument(f"no function is bound to model '{model}'")

        async def unload() -> None:
            await self._core.unload_model(model, any_mode=True)
        try:
            self._call(unload)
        finally:
            self._factory.unbind(model)
            shutil.rmtree(self._private / model, ignore_errors=True)

    # -- frontends -------------------------------------------------------------------------

    def start_frontend(self, kind: str, port: int, address: str | None = None) -> Frontend:
        """Start the ``kind`` frontend ("http", "grpc" or "metrics") on ``address:port``;
        it serves until :meth:`Frontend.stop` or the server's close."""
        settings = self.settings
        default = {"http": settings.http_address, "grpc": settings.grpc_address,
                   "metrics": settings.metrics_address}[kind]
        where = default if address is None else address
        own_stop = trio.Event()
        ended = trio.Event()

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            running, stop = self._running, self._front_stop
            if running is None or running.frontends is None or stop is None:
                raise Unavailable(CLOSED)
            try:
                async with trio.open_nursery() as own:
                    relay = trio.CancelScope()
                    own.start_soon(_relay_event, stop, own_stop, relay)
                    binds = await running.frontends.start(own, kind, own_stop, where, port)
                    task_status.started(binds)
                    await own_stop.wait()
                    relay.cancel()  # the frontend's tasks are all that is left to end
                    own.cancel_scope.deadline = (trio.current_time()
                                                 + settings.exit_timeout_secs)
            finally:
                ended.set()

        async def start() -> list[str]:
            if self._fronts is None:
                raise Unavailable(CLOSED)
            return await self._fronts.start(run)  # type: ignore[no-any-return]
        binds: list[str] = self._call(start)
        for bind in binds:
            log.info("Started %s at %s", {"http": "HTTPService", "grpc":
                                          "GRPCInferenceService",
                                          "metrics": "Metrics Service"}[kind], bind)
        return Frontend(self, kind, binds, own_stop, ended)

    def serve_http(self, port: int = 8000, address: str | None = None) -> list[str]:
        """Serve KServe v2 HTTP (and Triton's extensions) on ``address:port`` (port 0: a
        free one) until the server closes; the addresses it listens on."""
        return self.start_frontend("http", port, address).addresses

    def serve_grpc(self, port: int = 8001, address: str | None = None) -> list[str]:
        """Serve KServe v2 gRPC on ``address:port``; the addresses it listens on."""
        return self.start_frontend("grpc", port, address).addresses

    def serve_metrics(self, port: int = 8002, address: str | None = None) -> list[str]:
        """Serve Prometheus metrics on ``address:port``; the addresses it listens on."""
        return self.start_frontend("metrics", port, address).addresses


async def _relay_event(source: trio.Event, target: trio.Event,
                       scope: trio.CancelScope) -> None:
    with scope:
        await source.wait()
        target.set()


class Frontend:
    """One frontend started on an in-process server (:meth:`Server.start_frontend`)."""

    def __init__(self, server: Server, kind: str, addresses: list[str], stop: trio.Event,
                 ended: trio.Event) -> None:
        self.server, self.kind, self.addresses = server, kind, addresses
        self._stop, self._ended = stop, ended

    @property
    def running(self) -> bool:
        return not self._ended.is_set() and not self.server.closed

    def stop(self) -> None:
        """Stop accepting, let its connections drain (at most ``exit_timeout_secs``) and
        return once its port is closed."""
        if self.server.closed or self._ended.is_set():
            return

        async def stop() -> None:
            self._stop.set()
            await self._ended.wait()
        self.server._call(stop)


def _arrays(response: Any) -> dict[str, np.ndarray]:
    out = {}
    for tensor in response.outputs:
        data = tensor.data
        if tensor.datatype is DataType.BYTES:  # object arrays of bytes, as clients get
            flat = data.reshape(-1).tolist()
            if data.dtype != object or any(isinstance(v, str) for v in flat):
                data = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat],
                                dtype=object).reshape(data.shape)
        out[tensor.name] = data
    return out


def _streamed(item: Any) -> dict[str, np.ndarray] | None:
    """One item of a stream's inbox: a response's arrays to yield (None for an empty final
    flag); an error response raises; the stream task's end (an outcome) raises its error, if
    it failed before streaming, and otherwise gives None."""
    if not isinstance(item, Part):
        item.unwrap()
        return None
    if item.error is not None:
        raise item.error
    if item.response is not None and (item.response.outputs or not item.final):
        return _arrays(item.response)
    return None


@atexit.register
def _close_all() -> None:
    """Servers left open at exit drain as close() would (their thread is a daemon)."""
    for server in list(_OPEN):
        try:
            server.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            log.exception("closing a nursery.Server at exit failed")


__all__ = ["Frontend", "Server"]
