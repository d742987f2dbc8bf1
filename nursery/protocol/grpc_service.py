"""GRPCInferenceService: every RPC of Triton's gRPC API, each a few lines calling the core.

grpclib runs these handlers on the trio-asyncio loop (see ``grpc_server.py``); each handler
crosses into trio once (``trio_as_aio``) to reach the core. Errors become gRPC statuses in one
place (:func:`_status`), with the codes of ``status_map``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import betterproto
import grpclib
import grpclib.const
import grpclib.server
import trio
import trio_asyncio

from nursery.config_json import ConfigJsonError, config_from_json
from nursery.core import Core
from nursery.errors import ErrorKind, InvalidArgument, NurseryError, Unavailable, Unsupported
from nursery.protocol import grpc_codec, stats_codec
from nursery.protocol._generated import inference as pb
from nursery.protocol._generated.grpc.health import v1 as health_pb
from nursery.protocol.grpc_wire import FINAL_RESPONSE, encode_stream_response
from nursery.protocol.status_map import GRPC_STATUS


def _status(error: NurseryError) -> grpclib.GRPCError:
    return grpclib.GRPCError(grpclib.const.Status(GRPC_STATUS[error.kind]), error.message)


class Draining:
    """Counts RPCs in progress; once draining, new inference RPCs are refused."""

    def __init__(self) -> None:
        self.active = 0
        self.draining = False
        self.idle = trio.Event()
        self.idle.set()

    def enter(self) -> None:
        if self.draining:
            raise Unavailable("the server is shutting down")
        self.active += 1
        self.idle = trio.Event() if self.active == 1 else self.idle

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()


class InferenceService(pb.GrpcInferenceServiceBase):
    def __init__(self, core: Core, draining: Draining) -> None:
        self.core = core
        self.draining = draining

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a trio function from this asyncio handler; errors become gRPC statuses."""
        try:
            return await trio_asyncio.trio_as_aio(fn)(*args)
        except NurseryError as error:
            raise _status(error) from None

    def _sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NurseryError as error:
            raise _status(error) from None

    # -- health and metadata ---------------------------------------------------------------

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.core.server_live())

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.core.server_ready())

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.core.model_ready(request.name, request.version))

    async def server_metadata(
        self, request: pb.ServerMetadataRequest
    ) -> pb.ServerMetadataResponse:
        meta = self.core.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                         extensions=list(meta["extensions"]))

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self._sync(self.core.model_metadata, request.name, request.version)
        return grpc_codec.model_metadata(meta)

    async def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        handle = self._sync(self.core.resolve, request.name, request.version)
        return pb.ModelConfigResponse(config=handle.config.proto)

    # -- inference -------------------------------------------------------------------------

    async def model_infer(self, request: pb.ModelInferRequest) -> Any:
        return await self._call(self._infer, request)

    async def _infer(self, message: Any) -> bytes:
        """The ModelInferResponse in wire form (the codec passes bytes through)."""
        self.draining.enter()
        try:
            handle = self.core.resolve(message.model_name, message.model_version)
            if handle.config.decoupled:
                raise Unsupported(
                    f"ModelInfer RPC doesn't support models with decoupled transaction policy; "
                    f"use ModelStreamInfer for model '{message.model_name}'"
                )
            shm = self.core.shm
            request = grpc_codec.decode_request(message, shm)
            shm_outputs = grpc_codec.decode_shm_outputs(message, shm)
            response = await self.core.infer(request, handle)
            return grpc_codec.encode_response(response, None, shm_outputs, shm)
        finally:
            self.draining.leave()

    async def _stream_rpc(
        self, stream: grpclib.server.Stream[pb.ModelInferRequest, pb.ModelStreamInferResponse]
    ) -> None:
        """ModelStreamInfer: requests are served as they arrive, concurrently; each answer
        (or its error, as ``error_message``) is written when it is ready. The stream stays
        open after a failed request; the client ending or cancelling it is honoured."""
        await trio_asyncio.trio_as_aio(self._stream_trio)(stream)

    async def _stream_trio(self, stream: Any) -> None:
        receive = trio_asyncio.aio_as_trio(stream.recv_message)
        send = trio_asyncio.aio_as_trio(stream.send_message)
        lock = trio.Lock()

        async def answer(message: pb.ModelInferRequest) -> None:
            try:
                self.draining.enter()
            except NurseryError as error:
                reply = encode_stream_response(None, error.message)
            else:
                try:
                    handle = self.core.resolve(message.model_name, message.model_version)
                    shm = self.core.shm
                    request = grpc_codec.decode_request(message, shm)
                    shm_outputs = grpc_codec.decode_shm_outputs(message, shm)
                    response = await self.core.infer(request, handle)
                    reply = encode_stream_response(
                        grpc_codec.encode_response(response, FINAL_RESPONSE, shm_outputs, shm))
                except NurseryError as error:
                    reply = encode_stream_response(None, error.message)
                finally:
                    self.draining.leave()
            async with lock:
                await send(reply)

        async with trio.open_nursery() as nursery:
            while True:
                message = await receive()
                if message is None:
                    break
                nursery.start_soon(answer, message)

    # -- extensions that land later --------------------------------------------------------

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        entries = await self._call(self.core.model_statistics, request.name, request.version)
        return stats_codec.to_proto(entries)

    async def repository_index(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        entries = await self._call(self.core.repository_index, request.ready)
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponseModelIndex(
                name=e.name, version="" if e.version is None else str(e.version),
                state=e.state or "", reason=e.reason)
            for e in entries
        ])

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        if request.repository_name:
            raise _status(Unsupported("'repository_name' specification is not supported"))
        config = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            which, value = betterproto.which_one_of(param, "parameter_choice")
            if key == "config" and which == "string_param":
                try:
                    config = config_from_json(value)
                except ConfigJsonError as exc:
                    raise _status(InvalidArgument(
                        f"failed to parse the 'config' override: {exc}")) from None
            elif key.startswith("file:") and which == "bytes_param":
                files[key[len("file:"):]] = value
            else:
                raise _status(InvalidArgument(f"unrecognized load parameter '{key}' ({which})"))
        await self._call(self.core.load_model, request.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        if request.repository_name:
            raise _status(Unsupported("'repository_name' specification is not supported"))
        dependents = False
        param = request.parameters.get("unload_dependents")
        if param is not None:
            which, value = betterproto.which_one_of(param, "parameter_choice")
            dependents = bool(value) if which == "bool_param" else False
        await self._call(self.core.unload_model, request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    async def system_shared_memory_status(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._sync(self.core.shm.status, request.name, "system")
        return pb.SystemSharedMemoryStatusResponse(regions={
            r["name"]: pb.SystemSharedMemoryStatusResponseRegionStatus(**r) for r in regions})

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._sync(self.core.shm.register_system, request.name, request.key, request.offset,
                   request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        if request.name:
            self.core.shm.unregister(request.name, "system")
        else:
            self.core.shm.unregister_all("system")
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_shared_memory_status(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        regions = self._sync(self.core.shm.status, request.name, "cuda")
        return pb.CudaSharedMemoryStatusResponse(regions={
            r["name"]: pb.CudaSharedMemoryStatusResponseRegionStatus(**r) for r in regions})

    async def cuda_shared_memory_register(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._sync(self.core.shm.register_cuda, request.name, request.raw_handle,
                   request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def cuda_shared_memory_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        if request.name:
            self.core.shm.unregister(request.name, "cuda")
        else:
            self.core.shm.unregister_all("cuda")
        return pb.CudaSharedMemoryUnregisterResponse()

    async def trace_setting(self, request: Any) -> Any:
        raise _status(Unsupported("trace settings are not supported by this server yet"))

    async def log_settings(self, request: Any) -> Any:
        raise _status(Unsupported("log settings are not supported by this server yet"))

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        name = "/inference.GRPCInferenceService/ModelStreamInfer"
        mapping[name] = grpclib.const.Handler(
            self._stream_rpc, grpclib.const.Cardinality.STREAM_STREAM,
            pb.ModelInferRequest, pb.ModelStreamInferResponse,
        )
        return mapping


class HealthService(health_pb.HealthBase):
    """grpc.health.v1.Health: SERVING while the server is ready, as Triton answers."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def check(self, request: health_pb.HealthCheckRequest) -> health_pb.HealthCheckResponse:
        serving = self.core.server_ready()
        status = (health_pb.HealthCheckResponseServingStatus.SERVING if serving
                  else health_pb.HealthCheckResponseServingStatus.NOT_SERVING)
        return health_pb.HealthCheckResponse(status=status)


__all__ = ["InferenceService", "HealthService", "Draining", "ErrorKind"]
