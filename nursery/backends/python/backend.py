"""Python backend (``backend: "python"``): runs Triton ``model.py`` files unchanged.

Each model instance imports its own copy of ``model.py`` (Triton gives every instance its own
stub process, so module globals are per instance), creates ``TritonPythonModel`` and calls
``initialize(args)`` on the instance's own thread; ``execute(requests)`` and ``finalize()`` run
there too. ``import triton_python_backend_utils as pb_utils`` resolves to
:mod:`nursery.backends.python.pb_utils`.

Unlike the tensor backends, this one takes whole requests (``execute_requests``): a batch is
the list of requests the model's ``execute`` receives, each answered on its own. Answers:

- a returned ``InferenceResponse`` per request (its ``error`` becomes that request's error);
- or, through ``request.get_response_sender()``, responses sent from any thread: a decoupled
  model sends any number and then ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; each goes to the
  requester as it is sent (a :class:`nursery.messages.Part` on the request's unbounded reply
  channel, through the trio token);
- an exception from ``execute`` fails every request of the call with Triton's message
  ("Failed to process the request(s) for model instance ..."), never the instance.

A model whose ``initialize`` raises fails to load, with the traceback in the reason.
``auto_complete_config`` (static, optional) completes the configuration at load.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import itertools
import json
import logging
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from nursery.backends.base import drop_bogus_module
from nursery.backends.python import pb_utils
from nursery.backends.python.environment import PARAMETER as ENV_PARAMETER
from nursery.backends.python.environment import environment_path, interpreter_for
from nursery.backends.python.outbox import Route
from nursery.backends.python.sender import ResponseSender
from nursery.config.json_form import ConfigJsonError, config_to_json, message_from_json
from nursery.config.model import PYTHON_BASED_RUNTIME, ModelConfig
from nursery.errors import AnsweredError, ConfigError, InternalError, NurseryError
from nursery.execution.classification import classify_response
from nursery.execution.reshape import outputs_in_dims
from nursery.messages import InferWork, Part, Rescheduled
from nursery.runtime.devices import InstancePlacement
from nursery.runtime.thread_context import bind_context, current_context, current_token
from nursery.schema import inference as pb
from nursery.types import InferenceRequest, InferenceResponse, tensor_of

if TYPE_CHECKING:
    from nursery.backends.python.process import ProcessInstance

log = logging.getLogger("nursery.backends.python")

UTILS_MODULE = "triton_python_backend_utils"
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INSTANCE_MODE_KEY = "nursery_instance_mode"  # the model's parameter
INSTANCE_MODE_SETTING = "nursery-instance-mode"  # --backend-config=python,<this>=thread
DEFAULT_INSTANCE_MODE = "process"  # each instance in a stub process of its own, as in Triton
_module_ids = itertools.count()
_path_lock = threading.Lock()
_OWN_DIR = str(Path(__file__).resolve().parent.parent)


def _process() -> ModuleType:
    """:mod:`nursery.backends.python.process`, the server's side of stub processes, imported
    when the factory first needs it: a stub process imports this module for the instance and
    never for that (nor for trio, which it brings), so its start is shorter."""
    from nursery.backends.python import process
    return process


class _Refused(Exception):  # noqa: N818 - Triton's PythonBackendException
    """What the stub refuses in the answers of ``execute`` (reported without a type or
    frames, as Triton reports its own checks)."""


def register_utils() -> None:
    """Make ``import triton_python_backend_utils`` find nursery's implementation."""
    sys.modules.setdefault(UTILS_MODULE, pb_utils)


def describe(exc: BaseException) -> str:
    """An exception as Triton's Python backend reports it: ``Type: message``, then the
    frames, innermost first (``At:\\n  file(line): function``)."""
    text = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_OWN_DIR)]  # the model's frames only
    if frames:
        lines = [f"  {f.filename}({f.lineno}): {f.name}" for f in reversed(frames)]
        text += "\n\nAt:\n" + "\n".join(lines) + "\n"
    return text


def _model_file(config_filename: str, version_path: Path) -> Path:
    return version_path / (config_filename or "model.py")


def import_model(path: Path, model_name: str) -> ModuleType:
    """A fresh copy of ``model.py`` (its folder is on ``sys.path`` for sibling imports)."""
    register_utils()
    drop_bogus_module()  # a model may import torch, which walks sys.modules
    if not path.exists():
        raise ConfigError(f"model '{model_name}': unable to find '{path}'")
    folder = str(path.parent)
    with _path_lock:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    # the version folder is a package of its own, so a model split over several files can
    # use relative imports (``from .helpers import x``), as under Triton
    package_name = f"_nursery_python_model_{next(_module_ids)}"
    package = ModuleType(package_name)
    package.__path__ = [folder]
    package.__package__ = package_name
    sys.modules[package_name] = package
    name = f"{package_name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model '{model_name}': cannot import '{path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(
            f"model '{model_name}': failed to import '{path}': {describe(exc)}") from exc
    if not hasattr(module, "TritonPythonModel"):
        raise ConfigError(
            f"model '{model_name}': '{path}' defines no class 'TritonPythonModel'")
    return module


def instance_name(config: ModelConfig, placement: InstancePlacement) -> str:
    """Triton's instance name: ``<group name>_<index within the group>``."""
    start = 0
    for group in config.instance_groups:
        size = group.count * max(len(group.gpus), 1) if group.kind == "gpu" else group.count
        if placement.index < start + size:
            return f"{group.name}_{placement.index - start}"
        start += size
    return placement.name


class PythonInstance:
    """One ``TritonPythonModel``; every call runs on the instance worker's thread."""

    def __init__(self, model: Any, config: ModelConfig, version: str, name: str,
                 token: Any = None) -> None:
        self._model = model
        self.config = config
        self.version = version
        self.model_name = config.name
        self.instance_name = name
        self.decoupled = config.decoupled
        # iterative_sequence: a request the model releases with the RESCHEDULE flag runs again
        self.iterative = config.sequence is not None and config.sequence.schedule.iterative
        # how a sender's answer reaches the requester: the trio token on the server; in a
        # stub process, a stand-in that sends it on the channel
        self._token = token if token is not None else current_token()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._all_outputs = [o.name for o in config.outputs]
        self._output_set = frozenset(self._all_outputs)
        # implicit state outputs (sequence models) go back to the instance worker, which keeps
        # them for the slot and never sends them
        self._state_outputs = frozenset(config.sequence.state_outputs
                                        if config.sequence is not None else ())
        # the model's is_ready() (python_backend's user-defined readiness): asked by the
        # readiness endpoints
        self.has_ready_hook = callable(getattr(model, "is_ready", None))

    def check_ready(self) -> bool:
        """The model's ``is_ready()`` (``async def`` too), called off the execute thread as
        Triton's stub calls it; anything but a bool is an error, with Triton's words."""
        pb_utils.set_model_dir(str(self.config.path / self.version))
        result = self._model.is_ready()
        if inspect.isawaitable(result):
            result = self._await(result)
        if not isinstance(result, bool):
            raise InternalError("is_ready() must return a boolean value")
        return result

    # -- answers -----------------------------------------------------------------------------

    def convert(self, response: Any, request: InferenceRequest,
                sent: bool = False) -> InferenceResponse | NurseryError:
        """A model's ``InferenceResponse`` as nursery's response, or its error; every answer
        of the model passes here (returned by ``execute`` or sent by its response sender).
        ``sent``: an answer of the response sender, which goes to the requester from here, so
        it gets the classes its request asks for here too (the instance worker classifies
        returned answers; Triton's frontends classify every response, streamed ones too)."""
        if not isinstance(response, pb_utils.InferenceResponse):
            return InternalError(
                "Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(response)}'.")
        if response.has_error():
            error = pb_utils.error_to_nursery(response.error())
            return AnsweredError(error.message, error.kind)  # counted a success, as in Triton
        wanted = request.requested_outputs
        names = {o.name for o in wanted} if wanted else self._output_set
        if self._state_outputs:
            names = names | self._state_outputs
        outputs = []
        for tensor in response.output_tensors():
            if tensor.name() not in names:
                continue  # Triton returns only what was asked for (default: the config's)
            try:
                outputs.append(tensor._unwrap())
            except NurseryError as exc:
                return InternalError(f"model '{self.model_name}' output '{tensor.name()}': "
                                     f"{exc.message}")
        # in their configured dims (an output with a `reshape`), as Triton's core reports
        # every response's outputs: returned, sent, streamed by a decoupled model
        answer = InferenceResponse(self.model_name, self.version,
                                   outputs_in_dims(outputs, self.config), id=request.id,
                                   parameters=dict(response._parameters))
        return classify_response(request, answer, self.config) if sent else answer

    def _failure(self, exc: BaseException) -> NurseryError:
        what = str(exc) if isinstance(exc, _Refused) else describe(exc)
        return InternalError(  # Triton 2.51's words (it names the instance "model")
            f"Failed to process the request(s) for model '{self.instance_name}', "
            f"message: {what}")

    # -- execution ---------------------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """This instance's asyncio loop (for ``async def`` models), created on first use and
        run for good on a thread of its own, as Triton's stub runs one: tasks an ``execute``
        starts go on after it returns (a decoupled model's senders), and coroutines of several
        calls can be in flight. Its executor runs ``async_exec`` BLS calls; the loop's thread
        carries the instance thread's context (the model client)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            loop.set_default_executor(ThreadPoolExecutor(
                max_workers=64, thread_name_prefix=f"{self.instance_name}-bls"))
            context = current_context()

            model_dir = str(self.config.path / self.version)

            def run() -> None:
                bind_context(context)
                pb_utils.set_model_dir(model_dir)
                asyncio.set_event_loop(loop)
                loop.run_forever()

            self._loop_thread = threading.Thread(target=run, name=f"{self.instance_name}-async",
                                                 daemon=True)
            self._loop_thread.start()
            self._loop = loop
        return self._loop

    def _await(self, awaitable: Any) -> Any:
        """Run a coroutine on the instance's loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(awaitable, self._event_loop()).result()

    def _call_execute(self, requests: list[pb_utils.InferenceRequest],
                      senders: list[ResponseSender] | None = None) -> Any:
        result = self._model.execute(requests)
        if type(result) is not list and inspect.isawaitable(result):  # async def execute
            if self.decoupled and senders is not None:
                # as in Triton, a decoupled model's coroutine runs on while the next requests
                # come in; it answers through its senders (an exception closes what is open)
                future: Any = asyncio.run_coroutine_threadsafe(
                    result, self._event_loop())  # type: ignore[arg-type]
                future.add_done_callback(partial(self._finished_late, senders))
                return None
            result = self._await(result)
        return result

    def _finished_late(self, senders: list[ResponseSender], future: Any) -> None:
        exc = future.exception()
        if exc is None:
            if future.result() is None:
                return
            exc = _Refused(f"Python model '{self.instance_name}' is using the decoupled mode "
                           "and the execute function must return None.")
        error = self._failure(exc)
        log.error("%s", error.message)
        for sender in senders:
            answer = sender.fail(error)
            if answer is not None:
                sender._deliver(Part(None, answer, True))

    def execute_requests(self, work: Sequence[InferWork]) -> list[Any]:
        """Run ``execute`` on these requests; one answer per request, ``None`` where the
        response sender already answered (or will)."""
        senders = []
        requests = []
        token = self._token
        for item in work:
            request = item.request
            sender = ResponseSender(Route(token, item.reply), request, self, item.abandoned)
            senders.append(sender)
            names = [o.name for o in request.requested_outputs] or self._all_outputs
            requests.append(pb_utils.InferenceRequest._served(request, names, sender))
        return self._execute(requests, senders, [w.request for w in work])

    def _execute(self, requests: list[pb_utils.InferenceRequest], senders: list[ResponseSender],
                 originals: list[InferenceRequest]) -> list[Any]:
        """``execute``, then its answers checked as Triton's stub checks them: anything the
        rules refuse fails every request of the call that is not answered yet."""
        try:
            result = self._call_execute(requests, senders)
            return self._released(requests, senders, result,
                                  self._answers(result, senders, originals))
        except Exception as exc:
            error = self._failure(exc)
            log.error("%s", error.message)  # Triton logs it too (an error path, not the hot one)
            return [sender.fail(error) for sender in senders]
        finally:
            for sender in senders:
                sender.returned = True

    def _released(self, requests: list[pb_utils.InferenceRequest],
                  senders: list[ResponseSender], result: Any, answers: list[Any]) -> list[Any]:
        """The answers, with the requests the model released with the RESCHEDULE flag marked
        :class:`Rescheduled` (they run again; Triton's rules and messages for the rest)."""
        if not any(r._rescheduled() for r in requests):
            return answers
        out = []
        for i, (request, sender, answer) in enumerate(zip(requests, senders, answers,
                                                          strict=True)):
            error = None
            if not request._rescheduled():
                out.append(answer)
                continue
            if not self.iterative:
                error = InternalError(
                    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while "
                    "the model is not configured to handle such a flag.")
            elif not self.decoupled and result is not None and result[i] is not None:
                error = InternalError("Expected a None object in the execute function return "
                                      "list for reschduled request")  # Triton's words, spelling
            if error is None:
                out.append(Rescheduled())
            elif self.decoupled:
                out.append(sender.fail(error))  # unless the model's sender finished it
            else:  # instead of the response the model returned for it
                out.append(error)
        return out

    def _answers(self, result: Any, senders: list[ResponseSender],
                 originals: list[InferenceRequest]) -> list[Any]:
        if result is None:
            if self.decoupled:
                return [None] * len(senders)
            # the model may answer later through a sender it took; a request whose sender it
            # never took cannot be answered any more (Triton would leave it waiting)
            return [None if sender.taken else sender.fail(InternalError(
                f"Python model '{self.instance_name}' returned no response for a request: a "
                "model that is not decoupled must return one InferenceResponse per request, "
                "or send one through the request's response sender.")) for sender in senders]
        if self.decoupled:
            raise _Refused(f"Python model '{self.instance_name}' is using the decoupled mode "
                           "and the execute function must return None.")
        if type(result) is not list:
            raise _Refused("Expected a list in the execute return, found type "
                           f"'{type(result)}'.")
        if len(result) != len(senders):
            raise _Refused(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(senders)}, and "
                f"InferenceResponse(s) size is:{len(result)}\n")
        for sender, response in zip(senders, result, strict=True):
            if response is None:
                continue
            if not isinstance(response, pb_utils.InferenceResponse):
                raise _Refused("Expected an 'InferenceResponse' object in the execute "
                               f"function return list, found type '{type(response)}'.")
            if sender.sent > 0:
                raise _Refused("Unable to send response. Non-decoupled model cannot send "
                               "more than one response.")
        answers: list[Any] = []
        for sender, request, response in zip(senders, originals, result, strict=True):
            if response is None:
                answers.append(None if sender.taken else sender.fail(InternalError(
                    f"Python model '{self.instance_name}' returned None for a request whose "
                    "response sender it never used: nothing can answer that request.")))
            elif sender.claim():
                answers.append(self.convert(response, request))
            else:
                answers.append(None)  # the sender answered meanwhile (another thread)
        return answers

    def execute(self, inputs: Mapping[str, np.ndarray],
                output_names: Sequence[str]) -> dict[str, np.ndarray]:
        """One request from plain arrays (warm-up samples): the outputs, or the error raised."""
        request = InferenceRequest(self.model_name, self.version, {
            n: tensor_of(n, a) for n, a in inputs.items()})
        got: list[Any] = []

        def keep(answer: Any) -> None:
            got.append(answer.response if isinstance(answer, Part) else answer)

        sender = ResponseSender(keep, request, self, lambda: False)
        pb_request = pb_utils.InferenceRequest._served(request, list(output_names), sender)
        answers = self._execute([pb_request], [sender], [request])
        for answer in [*got, *answers]:
            if isinstance(answer, NurseryError):
                raise answer
            if isinstance(answer, InferenceResponse):
                return {t.name: t.data for t in answer.outputs}
        return {}

    def close(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        try:
            if finalize is not None:
                result = finalize()
                if inspect.isawaitable(result):
                    self._await(result)
        finally:
            loop = self._loop
            if loop is not None:
                loop.call_soon_threadsafe(loop.stop)
                if self._loop_thread is not None:
                    self._loop_thread.join(timeout=5)
                if not loop.is_running():
                    loop.close()


class PythonFactory:
    name = "python"
    platform = ""
    default_filename = "model.py"

    def __init__(self, instance_mode: str = DEFAULT_INSTANCE_MODE, name: str = "python",
                 script: Path | None = None, memory_limit: str = "") -> None:
        self.instance_mode = instance_mode  # the server's default (--backend-config)
        self.name = name
        self.script = script  # a Python-based backend's model.py (--backend-directory)
        self.memory_limit = memory_limit  # the server's default stub RSS limit ("": none)

    def configured(self, settings: Mapping[str, str]) -> PythonFactory:
        """This backend under ``--backend-config=python,...`` settings."""
        mode = settings.get(INSTANCE_MODE_SETTING, self.instance_mode).strip().lower()
        if mode not in ("thread", "process"):
            raise ConfigError(f"--backend-config=python,{INSTANCE_MODE_SETTING}: 'thread' or "
                              f"'process', not '{mode}'")
        process = _process()
        limit = settings.get(process.MEMORY_LIMIT_SETTING, self.memory_limit).strip()
        if limit:
            process.parse_size(limit, f"--backend-config=python,{process.MEMORY_LIMIT_SETTING}")
        return PythonFactory(mode, self.name, self.script, limit)

    def python_based(self, name: str, script: Path) -> PythonFactory:
        """Backend ``name`` served by ``script`` (``<backend directory>/<name>/model.py``):
        every model that names it runs that file, as Triton's Python-based backends do."""
        return PythonFactory(self.instance_mode, name, script, self.memory_limit)

    def memory_limit_of(self, config: ModelConfig) -> int | None:
        """``parameters { key: "nursery_memory_limit" value { string_value: "512M" } }`` (or
        the server's ``--backend-config=python,nursery-memory-limit=...``): the resident
        memory each stub process of the model may hold; past it the stub is killed and
        started again. None: no limit."""
        process = _process()
        raw = str(config.parameters.get(process.MEMORY_LIMIT_KEY, "")).strip() or self.memory_limit
        if not raw:
            return None
        return process.parse_size(raw, f"model '{config.name}': parameter "
                                       f"'{process.MEMORY_LIMIT_KEY}'")

    def model_file(self, default_model_filename: str, version_path: Path) -> Path:
        if self.script is not None:
            return self.script
        return _model_file(default_model_filename, version_path)

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton calls the model's static ``auto_complete_config`` with the configuration
        as read; what it completes (max_batch_size, inputs, outputs, dynamic batching, the
        transaction policy) goes back into ``config``. A model whose instances run in stub
        processes (or under its own ``EXECUTION_ENV_PATH``) is completed in a stub process
        too, so its ``model.py`` is never imported into the server."""
        if self.script is not None and not config.runtime:
            config.runtime = PYTHON_BASED_RUNTIME  # as Triton records a Python-based backend
        path = self.model_file(config.default_model_filename, version_path)
        given = json.loads(json.dumps(config_to_json(config)))
        if self._in_process(config) and not _process().valid_stub_name(config.name):
            return  # Triton refuses its stub before model.py runs: the instance's load says so
        if self._in_process(config):
            if not may_complete(path):
                return  # no auto_complete_config to run: no stub process started for it
            data = _process().complete_in_stub(path, config.name, str(version_path), given,
                                               _environment_of(config, version_path))
        else:
            data = complete_config(path, config.name, str(version_path), given)
        if data is None:
            return
        try:
            done: pb.ModelConfig = message_from_json(data, pb.ModelConfig, "config")
        except ConfigJsonError as exc:
            raise ConfigError(
                f"model '{config.name}': auto_complete_config produced an invalid "
                f"configuration: {exc}") from None
        config.max_batch_size = done.max_batch_size
        config.input = done.input
        config.output = done.output
        if "dynamic_batching" in data and "sequence_batching" not in data:
            config.dynamic_batching = done.dynamic_batching
        if "model_transaction_policy" in data:
            config.model_transaction_policy = done.model_transaction_policy

    def _in_process(self, config: pb.ModelConfig) -> bool:
        if ENV_PARAMETER in config.parameters or _process().MEMORY_LIMIT_KEY in config.parameters:
            return True
        if self.memory_limit:
            return True
        parameter = config.parameters.get(INSTANCE_MODE_KEY)
        mode = (parameter.string_value if parameter is not None else "").strip().lower()
        return (mode or self.instance_mode) == "process"

    def load(self, config: ModelConfig, version_path: Path,
             placement: InstancePlacement) -> PythonInstance | ProcessInstance:
        """The instance, in a stub process of its own (``nursery_instance_mode: "process"``)
        (the default) or on the instance worker's thread (``nursery_instance_mode: "thread"``)."""
        name = instance_name(config, placement)
        args = {
            "model_config": json.dumps(dict(config.json)),
            "model_instance_kind": placement.kind.upper(),
            "model_instance_name": name,
            "model_instance_device_id": str(placement.device_id),
            "model_repository": str(config.path),
            "model_version": version_path.name,
            "model_name": config.name,
        }
        path = self.model_file(config.default_model_filename, version_path)
        limit = self.memory_limit_of(config)
        if (instance_mode(config, self.instance_mode) == "process"
                or environment_path(config) is not None  # an environment needs a process
                or limit is not None):  # and so does a memory limit
            return _process().ProcessInstance(config, version_path.name, name, args, path, limit)
        return start_model(path, config, args, version_path.name, name)


def _environment_of(config: pb.ModelConfig, version_path: Path) -> Path | None:
    """The interpreter of a model's EXECUTION_ENV_PATH, from the configuration as read."""
    parameter = config.parameters.get(ENV_PARAMETER)
    raw = (parameter.string_value if parameter is not None else "").strip()
    if not raw:
        return None
    model_dir = version_path.parent
    env = Path(raw.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir)))
    try:
        return interpreter_for(config.name, env)
    except NurseryError as exc:
        raise ConfigError(exc.message) from None


_SOURCE_LIMIT = 4 * 1024 * 1024  # a larger model.py is completed in a stub, unread here


def may_complete(path: Path) -> bool:
    """Whether ``model.py`` may define ``auto_complete_config``, read without running it: False
    only when its source never names the method and defines ``TritonPythonModel`` as a plain
    module-level class (no base, keyword or decorator that could bring the method in). Then
    running it in a stub of its own would find no method and change nothing (an import error
    is the instance's load error, in the same words), so that process is not started; in any
    doubt (unreadable, unparsable, any other shape) it is."""
    try:
        if path.stat().st_size > _SOURCE_LIMIT:
            return True
        source = path.read_bytes()
    except OSError:
        return True
    if b"auto_complete_config" in source:
        return True
    try:
        tree = ast.parse(source, str(path))
    except (SyntaxError, ValueError):
        return True
    found = [node for node in tree.body
             if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel"]
    names = [node for node in ast.walk(tree)
             if isinstance(node, ast.Name | ast.alias) and "TritonPythonModel" in (
                 getattr(node, "id", None), getattr(node, "name", None),
                 getattr(node, "asname", None))]
    if len(found) != 1 or names:
        return True  # defined twice, imported, or assigned: not a plain class
    cls = found[0]
    return bool(cls.bases or cls.keywords or cls.decorator_list)


def complete_config(path: Path, model_name: str, model_dir: str,
                    given: dict[str, Any]) -> dict[str, Any] | None:
    """``TritonPythonModel.auto_complete_config`` of ``path`` on ``given`` (the configuration
    as Triton's JSON): the completed configuration, or None when the model has no such
    method. Raises :class:`ConfigError` with the model's words."""
    pb_utils.set_model_dir(model_dir)
    module = import_model(path, model_name)
    complete = getattr(module.TritonPythonModel, "auto_complete_config", None)
    if complete is None:
        return None
    helper = pb_utils.ModelConfig(given)
    try:
        result = complete(helper)
    except Exception as exc:
        raise ConfigError(
            f"model '{model_name}': auto_complete_config failed: {describe(exc)}") from exc
    if not isinstance(result, pb_utils.ModelConfig):  # None too, as Triton's stub refuses it
        raise ConfigError(f"auto_complete_config function in model '{model_name}' must "
                          "return a valid pb.ModelConfig object.")
    return result.as_dict()


def instance_mode(config: ModelConfig, default: str = DEFAULT_INSTANCE_MODE) -> str:
    """``parameters { key: "nursery_instance_mode" value: { string_value: "process" } }``
    runs each instance in a stub process; "thread" on the worker's thread; without the
    parameter, the server's default (``--backend-config=python,nursery-instance-mode=...``)."""
    mode = str(config.parameters.get(INSTANCE_MODE_KEY, default)).strip().lower() or default
    if mode not in ("thread", "process"):
        raise ConfigError(f"model '{config.name}': parameter '{INSTANCE_MODE_KEY}' must be "
                          f"'thread' or 'process', not '{mode}'")
    return mode


def start_model(path: Path, config: ModelConfig, args: dict[str, str], version: str,
                name: str, token: Any = None) -> PythonInstance:
    """Import ``model.py``, create ``TritonPythonModel`` and run its ``initialize``."""
    pb_utils.set_model_dir(str(config.path / version))
    module = import_model(path, config.name)
    try:
        model = module.TritonPythonModel()
        initialize = getattr(model, "initialize", None)
        if initialize is not None:
            result = initialize(args)
            if inspect.isawaitable(result):
                loop = asyncio.new_event_loop()
                try:
                    loop.run_until_complete(result)
                finally:
                    loop.close()
    except Exception as exc:
        log.error("Failed to initialize Python stub: %s", describe(exc))
        raise InternalError(describe(exc)) from exc  # the load failure reason, as Triton
    return PythonInstance(model, config, version, name, token)



FACTORY = PythonFactory()
