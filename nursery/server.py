"""The supervisor: one root nursery, actors started in dependency order, clean shutdown.

Start-up: the ModelManager loads the start-up models (``--exit-on-error`` decides what a
failure, or a repository that cannot be read, means), then the frontends start listening.
Shutdown (SIGINT/SIGTERM, or the caller's ``shutdown`` event): the frontends stop accepting and
finish their in-flight requests, then the manager drains and unloads every model;
``--exit-timeout-secs`` bounds the whole of it.
"""

from __future__ import annotations

import errno
import logging
import math
import signal
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import trio

from nursery.actors import model_manager, rate_limiter, repository_poller, response_cache
from nursery.actors.demand import DemandLoader
from nursery.actors.directory import Directory
from nursery.actors.model_client import ModelClient
from nursery.actors.rate_limiter import RateLimiterClient
from nursery.backends.base import BackendFactory, Backends
from nursery.config.repository import scan
from nursery.core import Core, Lifecycle, Services
from nursery.errors import NurseryError, StartupError, first_error
from nursery.messages import ManagerCommand
from nursery.observability.arrival_log import ArrivalLog
from nursery.observability.custom_metrics import CustomMetrics
from nursery.observability.logs import LogManager
from nursery.observability.metrics import MetricsOptions
from nursery.observability.system import SystemSampler
from nursery.observability.tracing import TraceManager
from nursery.protocol import card_servers
from nursery.protocol.frontends.supervisor import FrontendProcesses
from nursery.protocol.grpc.server import serve_grpc
from nursery.protocol.http import http1
from nursery.protocol.http.metrics import build_metrics_app, metrics_text
from nursery.protocol.http.routes import build_routes_app
from nursery.protocol.http.server import Handler, HttpServer
from nursery.protocol.listeners import open_listeners
from nursery.protocol.openai.frontend import OpenAIFrontend
from nursery.protocol.openai.tokenizer import Tokenizer, TokenizerError, load_chat_template
from nursery.protocol.sagemaker import SageMakerFrontend
from nursery.protocol.tls import TlsError, server_context
from nursery.protocol.vertex_ai import VertexAiFrontend, check_routes, default_model
from nursery.runtime.heap import settle_heap
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.rate_limit_policy import RateLimitPolicy
from nursery.settings import Settings
from nursery.shm.system import SharedMemoryRegistry

log = logging.getLogger("nursery.server")


@dataclass(frozen=True)
class Running:
    """What ``serve`` reports once it accepts traffic."""

    core: Core
    http_binds: tuple[str, ...]
    failed_models: tuple[str, ...]
    shutdown: trio.Event
    frontends: Frontends | None = None  # starts more frontends later (the in-process API)


@dataclass(frozen=True)
class Frontends:
    """What starting a frontend needs, kept for frontends started on a running server (the
    in-process API's ``serve_http`` / ``serve_grpc`` / ``serve_metrics``, as Triton's
    ``tritonfrontend`` starts them on an in-process server). Each stops accepting and drains
    once its ``stop`` event is set."""

    core: Core
    settings: Settings
    sampler: SystemSampler
    options: MetricsOptions
    sampling: bool  # the system sampler runs already (--allow-metrics)

    async def start(self, nursery: trio.Nursery, kind: str, stop: trio.Event,
                    address: str, port: int) -> list[str]:
        """Start the ``kind`` frontend ("http", "grpc" or "metrics") on ``address:port``
        (port 0: a free one) in ``nursery``; the addresses it listens on."""
        if kind == "http":
            settings = replace(self.settings, allow_http=True, http_address=address,
                               http_port=port)
            return await _start_http(nursery, self.core, settings, stop,
                                     _tls_contexts(settings).http)
        if kind == "grpc":
            settings = replace(self.settings, allow_grpc=True, grpc_address=address,
                               grpc_port=port)
            binds: list[str] = await nursery.start(
                serve_grpc, self.core, address, port, stop, settings.grpc_server, settings,
                _tls_contexts(settings).grpc)
            return binds
        if kind == "metrics":
            settings = replace(self.settings, metrics_address=address, metrics_port=port)
            return await _start_metrics(
                nursery, self.core, settings, self.sampler, self.options, stop,
                sample_every=None if self.sampling else settings.metrics_interval_ms / 1000.0)
        raise ValueError(f"unknown frontend '{kind}' (http, grpc or metrics)")


def startup_models(settings: Settings) -> tuple[list[str], list[str]]:
    """The models to load at start-up, and why repositories the start-up reads could not be
    read. As in Triton, the start-up reads every repository in the none and poll modes and
    for ``--load-model=*``; named start-up models are only looked for (a model found in no
    repository fails to load)."""
    if settings.model_control_mode == "explicit" and settings.load_models != ("*",):
        return list(settings.load_models), []
    repo = scan(settings.model_repositories)
    if settings.model_control_mode == "explicit" and not settings.model_namespacing:
        return sorted(repo.models), list(repo.unreadable.values())
    return sorted([*repo.models, *repo.duplicates]), list(repo.unreadable.values())


async def _watch_signals(
    shutdown: trio.Event,
    exit_timeout: float,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """First SIGINT/SIGTERM: graceful shutdown. A second one: stop at once."""
    with trio.CancelScope() as scope, trio.open_signal_receiver(
        signal.SIGINT, signal.SIGTERM
    ) as signals:
        task_status.started(scope)
        async for signum in signals:
            if not shutdown.is_set():
                log.info("received %s: shutting down (up to %.0f s for in-flight requests)",
                         signal.Signals(signum).name, exit_timeout)
                shutdown.set()
            else:
                log.warning("second signal: exiting now")
                raise KeyboardInterrupt


class _Deadlines(TypedDict):
    head_timeout: float
    body_timeout: float
    keep_alive_timeout: float


def _backend_settings(settings: Settings) -> dict[str, dict[str, str]]:
    """--backend-config as {backend: {setting: value}}, "" for every backend's; the global
    settings Triton's core gives every backend come first (the command line's override)."""
    out: dict[str, dict[str, str]] = {"": {
        "auto-complete-config": "true" if settings.auto_complete else "false",
        "backend-directory": str(settings.backend_directory)}}
    for backend, key, value in settings.backend_config:
        out.setdefault(backend, {})[key] = value
    return out


def _http_deadlines(settings: Settings) -> _Deadlines:
    return {"head_timeout": settings.http_head_timeout,
            "body_timeout": settings.http_body_timeout,
            "keep_alive_timeout": settings.http_keepalive_timeout}


@dataclass(frozen=True)
class _Tls:
    """The ports' TLS contexts, built once before anything starts (None: clear text)."""

    http: ssl.SSLContext | None = None
    grpc: ssl.SSLContext | None = None


def _tls_contexts(settings: Settings) -> _Tls:
    """Read the certificate files now: a file that cannot be read or a key that does not
    fit stops the start-up with the reason."""
    try:
        http = (server_context(settings.http_tls, ["http/1.1"], "--http-ssl-cert")
                if settings.http_tls is not None and settings.allow_http else None)
        grpc = (server_context(settings.grpc_tls, ["h2"], "--grpc-use-ssl")
                if settings.grpc_tls is not None and settings.allow_grpc else None)
    except TlsError as exc:
        raise StartupError(str(exc)) from None
    return _Tls(http, grpc)


async def _start_http(nursery: trio.Nursery, core: Core, settings: Settings,
                      shutdown: trio.Event, tls: ssl.SSLContext | None = None) -> list[str]:
    """Start the HTTP frontend; it stops accepting and drains once ``shutdown`` is set."""
    if settings.http_server == "hypercorn":
        if settings.http_frontend_processes:
            log.warning("--http-frontend-processes is not used with --http-server=hypercorn: "
                        "the engine serves the HTTP port alone")
        card = card_servers.hypercorn_server()  # the card's server, an optional extra
        binds: list[str] = await nursery.start(card.serve_hypercorn, core, settings, shutdown)
        return binds
    server = HttpServer(core, build_routes_app(core),
                        max_input_size=settings.http_max_input_size,
                        max_body_size=settings.http_max_body_size,
                        max_connections=settings.http_max_connections, faults=core.faults,
                        tls=tls if not settings.http_frontend_processes else None,
                        restrictions=settings.http_restrictions,
                        forward=settings.http_forward, **_http_deadlines(settings))
    if settings.http_frontend_processes:
        return await _start_frontends(nursery, core, server, settings, shutdown)
    return await _serve_until(nursery, server, settings.http_address, settings.http_port,
                              shutdown, settings.reuse_http_port, settings.exit_timeout_secs)


async def _start_frontends(nursery: trio.Nursery, core: Core, server: HttpServer,
                           settings: Settings, shutdown: trio.Event) -> list[str]:
    """--http-frontend-processes: the engine's HTTP server on a loopback port of its own
    (what the frontends forward), the public port's sockets opened here and served by the
    frontend processes. The engine's server closes once the frontends are gone."""
    gone = trio.Event()
    inner = await _serve_until(nursery, server, "127.0.0.1", 0, gone)
    listeners, binds = await open_listeners(settings.http_address, settings.http_port, None,
                                            settings.reuse_http_port)
    sockets = [listener for listener in listeners if isinstance(listener, trio.SocketListener)]
    frontends = FrontendProcesses(core, settings, sockets, int(inner[0].rsplit(":", 1)[1]),
                                  settings.http_frontend_processes)
    await nursery.start(frontends.run, shutdown, gone)
    log.info("HTTP port served by %d frontend processes; the engine's own HTTP server is at %s",
             settings.http_frontend_processes, inner[0])
    return binds


async def _serve_until(nursery: trio.Nursery, server: HttpServer, address: str, port: int,
                       shutdown: trio.Event, reuse_port: bool = False,
                       exit_timeout: float | None = None) -> list[str]:
    """``server`` on ``address:port`` in ``nursery`` until ``shutdown`` is set, then closed:
    it stops accepting and drains; returns its binds once it listens. ``exit_timeout`` (the
    inference port, as Triton's HTTP server stops): the connections open at the shutdown
    stay served until their clients close them, for at most that long (``HttpServer.drain``);
    None: idle ones close at once."""
    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        async with trio.open_nursery() as inner:
            binds = await inner.start(server.serve, address, port, reuse_port)
            task_status.started(binds)
            await shutdown.wait()
            if exit_timeout is None:
                server.close()
            else:
                await server.drain(exit_timeout)
        # serve() returned: nothing accepted any more, every connection finished

    return await nursery.start(run)  # type: ignore[no-any-return]


async def _run_poller(scope: trio.CancelScope, settings: Settings,
                      manager: trio.MemorySendChannel[Any], faults: FaultCounter,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await repository_poller.run(repositories=settings.model_repositories, manager=manager,
                                    interval=float(settings.repository_poll_secs),
                                    faults=faults, namespacing=settings.model_namespacing,
                                    task_status=task_status)


async def _cancel_on(event: trio.Event, target: trio.CancelScope,
                     guard: trio.CancelScope) -> None:
    """Cancel ``target`` when ``event`` is set, unless ``guard`` ends first."""
    with guard:
        await event.wait()
        target.cancel()


@contextmanager
def _port_in_use(service: str, address: str, port: int,
                 optional: bool = False) -> Iterator[None]:
    """A frontend whose port is taken stops the start-up with Triton's line ("failed to start
    GRPC service: Unavailable - Socket '0.0.0.0:8001' already in use"), not a traceback; so
    does an address that is not one (``--http-address -47``). ``optional``: the service's
    address is one it inherited from a service that is off (the metrics port takes
    ``--http-address`` when ``--metrics-address`` is not given, even with ``--allow-http
    false``, as in Triton, which starts anyway): the server then runs without it, and logs
    why."""
    try:
        yield
    except BaseException as exc:  # the bind error may come wrapped in a trio group
        error = first_error(exc)
        if isinstance(error, socket.gaierror):
            reason = f"cannot listen on '{address}:{port}': {error.strerror or error}"
            if optional:
                log.error("failed to start %s service: Invalid argument - %s (the address of "
                          "--http-address, whose service is off; give --metrics-address); "
                          "serving without it", service, reason)
                return
            log.error("failed to start %s service: Invalid argument - %s", service, reason)
            raise StartupError(f"failed to start {service} service: {reason}") from None
        if not (isinstance(error, OSError) and error.errno == errno.EADDRINUSE):
            raise
        log.error("failed to start %s service: Unavailable - Socket '%s:%d' already in use ",
                  service, address, port)
        raise StartupError(f"failed to start {service} service: Socket '{address}:{port}' "
                           "already in use") from None


def _report_inactive(settings: Settings) -> None:
    for flag in settings.inactive:
        log.warning("%s is accepted but not active yet in this build; it is ignored", flag)


async def _start_metrics(nursery: trio.Nursery, core: Core, settings: Settings,
                         sampler: SystemSampler, options: MetricsOptions,
                         shutdown: trio.Event, sample_every: float | None = None) -> list[str]:
    """The metrics endpoint on its own port; it stops accepting once ``shutdown`` is set.
    ``sample_every``: seconds between system samples, for a metrics port started on a
    server whose sampler does not run (it runs as long as the port)."""
    server = HttpServer(core, build_metrics_app(core, sampler, options),
                        max_input_size=64 * 1024, serve_infer=False,
                        max_connections=settings.metrics_max_connections, faults=core.faults,
                        **_http_deadlines(settings))

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        sampling = trio.CancelScope()
        async with trio.open_nursery() as inner:
            if sample_every is not None:
                await inner.start(_run_sampler, sampling, sampler, sample_every)
            binds = await inner.start(server.serve, settings.metrics_address,
                                      settings.metrics_port)
            task_status.started(binds)
            await shutdown.wait()
            server.close()
            sampling.cancel()

    return await nursery.start(run)  # type: ignore[no-any-return]


def _openai_tokenizer(settings: Settings) -> Tokenizer | None:
    """--tokenizer (and --chat-template), read before anything starts: a folder that cannot
    be read, or the llm extra missing, stops the start-up with the reason."""
    options = settings.openai
    if options is None or not options.tokenizer:
        return None
    try:
        return Tokenizer(Path(options.tokenizer), load_chat_template(options.chat_template))
    except TokenizerError as exc:
        raise StartupError(f"--tokenizer: {exc}") from None


async def _start_openai(nursery: trio.Nursery, core: Core, settings: Settings,
                        shutdown: trio.Event, tokenizer: Tokenizer | None,
                        sampler: SystemSampler, metrics_options: MetricsOptions) -> list[str]:
    """The OpenAI-compatible frontend on its own port (nursery's HTTP/1.1 server with the
    OpenAI handler; its /metrics is the metrics port's text); it stops accepting once
    ``shutdown`` is set."""
    options = settings.openai
    assert options is not None
    text = metrics_text(core, sampler, metrics_options) if settings.allow_metrics else None
    try:
        frontend = OpenAIFrontend(core, options, tokenizer, text)
    except TokenizerError as exc:
        raise StartupError(str(exc)) from None
    server = HttpServer(core, build_routes_app(core), max_input_size=options.max_input_size,
                        max_connections=settings.http_max_connections, faults=core.faults,
                        serve_infer=False, handler=frontend.handle,
                        refuse_body=frontend.too_large, unit="openai",
                        **_http_deadlines(settings))
    return await _serve_until(nursery, server, options.address, options.port, shutdown)


def _http_frontend_server(core: Core, settings: Settings, handler: Handler,
                          limit_body: Callable[[http1.RequestHead], int], unit: str
                          ) -> HttpServer:
    """nursery's HTTP/1.1 server for a frontend of its own (SageMaker's, Vertex AI's) under
    the HTTP port's input and body sizes, connection cap and deadlines, as Triton's frontends
    reuse its HTTP settings; ``handler`` answers every request."""
    return HttpServer(core, build_routes_app(core), max_input_size=settings.http_max_input_size,
                      max_body_size=settings.http_max_body_size,
                      max_connections=settings.http_max_connections, faults=core.faults,
                      serve_infer=False, handler=handler, limit_body=limit_body, unit=unit,
                      **_http_deadlines(settings))


async def _start_sagemaker(nursery: trio.Nursery, core: Core, settings: Settings,
                           shutdown: trio.Event) -> list[str]:
    """The SageMaker frontend on its own port (nursery's HTTP/1.1 server with the SageMaker
    handler), under the HTTP port's limits, deadlines, connection cap and restrictions, as
    Triton's SageMaker server reuses its HTTP settings; it stops accepting and drains once
    ``shutdown`` is set."""
    options = settings.sagemaker
    assert options is not None
    frontend = SageMakerFrontend(core, options, settings.http_restrictions,
                                 settings.http_max_input_size, settings.http_max_body_size)
    server = _http_frontend_server(core, settings, frontend.handle, frontend.body_limit, "sagemaker")
    return await _serve_until(nursery, server, options.address, options.port, shutdown)


async def _start_vertex_ai(nursery: trio.Nursery, core: Core, settings: Settings,
                           sampler: SystemSampler, options: MetricsOptions,
                           shutdown: trio.Event) -> list[str]:
    """The Vertex AI frontend on its own port, under the HTTP port's limits, deadlines,
    connection cap and restrictions, as Triton's Vertex AI server reuses its HTTP settings.
    Its routes must be set and its default model ready, else the start fails in Triton's
    words; it stops accepting and drains once ``shutdown`` is set."""
    vertex = settings.vertex_ai
    assert vertex is not None
    try:
        check_routes(vertex.predict_route, vertex.health_route)
        ready = [entry.name for entry in await core.repository_index(ready_only=True)]
        model = default_model(vertex.default_model, ready)
    except NurseryError as error:
        log.error("failed to start Vertex AI service: Invalid argument - %s", error.message)
        raise StartupError(f"failed to start Vertex AI service: {error.message}") from None
    frontend = VertexAiFrontend(
        core, vertex.predict_route, vertex.health_route, model, settings.http_restrictions,
        settings.http_max_input_size, settings.http_max_body_size,
        metrics_text(core, sampler, options) if settings.allow_metrics else None)
    server = _http_frontend_server(core, settings, frontend.handle, frontend.body_limit, "vertex_ai")
    return await _serve_until(nursery, server, vertex.address, vertex.port, shutdown)


async def _run_sampler(scope: trio.CancelScope, sampler: SystemSampler, interval: float,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await sampler.run(interval, task_status=task_status)


async def serve(
    settings: Settings,
    *,
    handle_signals: bool = True,
    log_manager: LogManager | None = None,
    backends: Mapping[str, BackendFactory] | None = None,
    settle: bool = True,
    custom_metrics: CustomMetrics | None = None,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT/SIGTERM (with ``handle_signals``) or the reported ``shutdown``
    event. ``backends``: backends beside the built-in ones, by name (the in-process API's
    bound callables). ``settle``: freeze the start-up heap (``runtime/heap.py``); a server
    embedded in another program leaves that program's heap alone. ``custom_metrics``: the
    registry of user-defined metric families (default: the server's own), which the
    ``tritonserver`` package shares across its servers as Triton's are process-wide."""
    _report_inactive(settings)
    try:
        card_servers.check_selected(settings)
    except (card_servers.MissingExtra, card_servers.NotServed) as exc:
        raise StartupError(str(exc)) from None
    tls = _tls_contexts(settings)
    tokenizer = _openai_tokenizer(settings)
    try:
        tracer = TraceManager(settings.trace)
    except ValueError as exc:  # e.g. OpenTelemetry mode without its packages
        raise StartupError(str(exc)) from None
    arrival_log: ArrivalLog | None = None
    if settings.arrival_log:
        try:
            arrival_log = ArrivalLog(settings.arrival_log)
        except OSError as exc:
            raise StartupError(
                f"cannot open the arrival log '{settings.arrival_log}': {exc}") from None
    options = MetricsOptions.from_config(settings.metrics_config,
                                         cpu=settings.allow_cpu_metrics,
                                         gpu=settings.allow_gpu_metrics)
    shutdown = trio.Event()
    try:
        # a repository that cannot be read (a mistyped path, say) fails the start-up with
        # --exit-on-error; without it, the server serves what the other repositories hold
        names, unreadable = await trio.to_thread.run_sync(startup_models, settings)
        for reason in unreadable:
            log.error("%s", reason)
        if unreadable and settings.exit_on_error:
            raise StartupError(f"failed to load all models: {unreadable[0]}")
        await _serve(settings, names, tracer, arrival_log, log_manager, options, shutdown,
                     handle_signals, task_status, tls, backends, settle, tokenizer,
                     failed_to_initialize=bool(unreadable), custom_metrics=custom_metrics)
    finally:
        tracer.close()  # traces buffered for log_frequency 0 are written now
        if arrival_log is not None:
            arrival_log.close()
    log.info("server stopped")


async def _serve(settings: Settings, names: list[str], tracer: TraceManager,
                 arrival_log: ArrivalLog | None,
                 log_manager: LogManager | None, options: MetricsOptions, shutdown: trio.Event,
                 handle_signals: bool, task_status: trio.TaskStatus[Running],
                 tls: _Tls, extra_backends: Mapping[str, BackendFactory] | None,
                 settle: bool, tokenizer: Tokenizer | None = None,
                 failed_to_initialize: bool = False,
                 custom_metrics: CustomMetrics | None = None) -> None:
    """``failed_to_initialize``: a repository could not be read and --exit-on-error is off;
    as Triton's server in its FAILED_TO_INITIALIZE state, this one then serves (metadata, the
    models it could load) but is neither live nor ready."""
    directory = Directory()
    faults = FaultCounter()
    commands, inbox = trio.open_memory_channel[ManagerCommand](16)
    async with trio.open_nursery() as root:
        watcher: trio.CancelScope | None = None
        if handle_signals:
            watcher = await root.start(_watch_signals, shutdown, settings.exit_timeout_secs)
        cache: trio.MemorySendChannel[Any] | None = None
        if settings.cache is not None:
            cache, cache_inbox = trio.open_memory_channel[Any](math.inf)
            await root.start(partial(response_cache.run, config=settings.cache,
                                     inbox=cache_inbox, faults=faults))
        limiter: RateLimiterClient | None = None
        if settings.rate_limit == "execution_count":
            limits_send, limits_inbox = trio.open_memory_channel[Any](math.inf)
            await root.start(partial(rate_limiter.run,
                                     policy=RateLimitPolicy(dict(settings.rate_limit_resources)),
                                     inbox=limits_inbox, faults=faults))
            limiter = RateLimiterClient(limits_send)
        # the one way requests reach models: frontends (through the core), ensembles, BLS
        client = ModelClient(directory, tracer=tracer, cache=cache, arrival_log=arrival_log,
                             custom_metrics=custom_metrics if custom_metrics is not None
                             else CustomMetrics())
        lifecycle = Lifecycle(live=not failed_to_initialize)
        core = Core(Services(directory, client, commands, faults=faults,
                             shm=SharedMemoryRegistry(allow_client=settings.allow_client_shm),
                             allow_model_file_upload=settings.allow_model_file_upload,
                             log_manager=log_manager, lifecycle=lifecycle,
                             server_name=settings.server_id,
                             strict_readiness=settings.strict_readiness,
                             control_mode=settings.model_control_mode,
                             demand=DemandLoader(
                                 directory, commands, client,
                                 on_demand=settings.model_load_on_demand,
                                 timeout=settings.model_load_on_demand_timeout_secs,
                                 budget=settings.model_load_budget,
                                 pinned=settings.model_load_pins)))
        sampling = trio.CancelScope()
        sampler = SystemSampler(cpu=options.cpu, gpu=options.gpu)
        if settings.allow_metrics:
            await root.start(_run_sampler, sampling, sampler,
                             settings.metrics_interval_ms / 1000.0)
        async with trio.open_nursery() as models:
            # A shutdown signal during start-up cancels the loading: instances already loaded
            # are finalized on their threads, nothing half-loaded stays behind.
            startup = trio.CancelScope()
            guard = trio.CancelScope()  # entered by _cancel_on; cancelled once start-up is over
            root.start_soon(_cancel_on, shutdown, startup, guard)
            try:
                with startup:
                    failed = await models.start(
                        partial(
                            model_manager.run,
                            repositories=settings.model_repositories,
                            directory=directory,
                            inbox=inbox,
                            startup_models=names,
                            exit_on_error=settings.exit_on_error,
                            cloud_cache=settings.cloud_cache_directory,
                            client=client,
                            backends=Backends(extra_backends,
                                             settings=_backend_settings(settings),
                                             directory=settings.backend_directory),
                            summaries=settings.allow_metrics and options.summary_latencies,
                            auto_complete=settings.auto_complete,
                            unload_timeout=settings.model_unload_timeout_secs,
                            config_name=settings.model_config_name,
                            load_retries=settings.model_load_retry_count,
                            namespacing=settings.model_namespacing,
                            rate_limiter=limiter,
                            faults=faults,
                        )
                    )
            finally:
                guard.cancel()
            if startup.cancelled_caught:
                log.info("shutdown during start-up: loading stopped")
                if watcher is not None:
                    watcher.cancel()
                sampling.cancel()
                if cache is not None:
                    cache.close()
                if limiter is not None:
                    limiter.inbox.close()
                return
            lifecycle.accepting = not failed_to_initialize
            poller: trio.CancelScope | None = None
            if settings.model_control_mode == "poll":
                poller = trio.CancelScope()
                await models.start(_run_poller, poller, settings, commands.clone(), faults)
            async with commands, trio.open_nursery() as frontends:
                binds: list[str] = []
                if settings.allow_grpc:
                    with _port_in_use("GRPC", settings.grpc_address, settings.grpc_port):
                        grpc_binds = await frontends.start(
                            serve_grpc, core, settings.grpc_address, settings.grpc_port,
                            shutdown, settings.grpc_server, settings, tls.grpc,
                        )
                    for bind in grpc_binds:
                        log.info("Started GRPCInferenceService at %s", bind)
                if settings.allow_http:
                    with _port_in_use("HTTP", settings.http_address, settings.http_port):
                        binds = await _start_http(frontends, core, settings, shutdown, tls.http)
                    for bind in binds:
                        log.info("Started HTTPService at %s", bind.removeprefix("http://"))
                if settings.openai is not None:
                    for bind in await _start_openai(frontends, core, settings, shutdown,
                                                    tokenizer, sampler, options):
                        log.info("Started OpenAI-compatible frontend at %s", bind)
                if settings.sagemaker is not None:
                    with _port_in_use("Sagemaker", settings.sagemaker.address,
                                      settings.sagemaker.port):
                        sagemaker_binds = await _start_sagemaker(frontends, core, settings,
                                                                 shutdown)
                    for bind in sagemaker_binds:
                        log.info("Started Sagemaker HTTPService at %s",
                                 bind.removeprefix("http://"))
                if settings.vertex_ai is not None:
                    with _port_in_use("Vertex AI", settings.vertex_ai.address,
                                      settings.vertex_ai.port):
                        vertex_binds = await _start_vertex_ai(frontends, core, settings,
                                                              sampler, options, shutdown)
                    for bind in vertex_binds:
                        log.info("Started Vertex AI HTTPService at %s",
                                 bind.removeprefix("http://"))
                if settings.allow_metrics and settings.open_metrics_port:
                    metrics_binds = []
                    inherited = not settings.allow_http and settings.metrics_address in (
                        "", settings.http_address)
                    with _port_in_use("Metrics", settings.metrics_address or
                                      settings.http_address, settings.metrics_port, inherited):
                        metrics_binds = await _start_metrics(frontends, core, settings, sampler,
                                                             options, shutdown)
                    for bind in metrics_binds:
                        log.info("Started Metrics Service at %s", bind)
                if settle:
                    settle_heap()
                task_status.started(Running(
                    core, tuple(binds), tuple(failed), shutdown,
                    Frontends(core, settings, sampler, options, sampling=settings.allow_metrics)))
                await shutdown.wait()
                log.info("Waiting for in-flight requests to complete.")  # Triton's words
                lifecycle.accepting = False
                frontends.cancel_scope.deadline = trio.current_time() + settings.exit_timeout_secs
            if poller is not None:
                poller.cancel()
            # The frontends finished their in-flight requests. Closing `commands` makes the
            # manager drain and unload every model and return, which ends `models`.
            models.cancel_scope.deadline = trio.current_time() + settings.exit_timeout_secs
        if watcher is not None:
            watcher.cancel()
        sampling.cancel()
        if cache is not None:
            cache.close()  # the cache actor ends
        if limiter is not None:
            limiter.inbox.close()
