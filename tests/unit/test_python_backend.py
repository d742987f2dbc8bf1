"""The Python backend without a server: the pb_utils API (auto-complete helper, tensors),
auto_complete_config into the typed config, and how execute's answers become each request's
response or error (Triton's messages)."""

from __future__ import annotations

import math
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from nursery.backends.base import get_factory
from nursery.backends.python import backend as python_backend
from nursery.backends.python import pb_utils
from nursery.config.model import read_model_config
from nursery.errors import ErrorKind, InternalError, NurseryError
from nursery.messages import InferWork, Part
from nursery.observability.tracing import ChildOf, Trace, TraceLink, TraceManager, TraceSettings
from nursery.runtime.devices import InstancePlacement
from nursery.types import DataType, InferenceRequest, InferenceResponse, Tensor

# these tests look inside the in-thread instance (the process mode has its own, e2e tests)
THREADED = python_backend.PythonFactory("thread")


def test_model_config_helper_follows_tritons_rules() -> None:
    cfg = pb_utils.ModelConfig('{"name": "m", "max_batch_size": 8, "input": [], "output": []}')
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8, but in "
                       "auto-complete-config function for model 'm' specified max_batch_size 4"):
        cfg.set_max_batch_size(4)
    cfg.set_max_batch_size(16)
    assert cfg.get_max_batch_size() == 16
    cfg.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input 'X'"):
        cfg.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="contains property other than"):
        cfg.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [4], "shape": 1})
    with pytest.raises(ValueError, match="is missing 'dims' property"):
        cfg.add_output({"name": "Y", "data_type": "TYPE_FP32"})
    cfg.set_model_transaction_policy({"decoupled": True})
    assert pb_utils.using_decoupled_model_transaction_policy(cfg.as_dict())
    seq = pb_utils.ModelConfig({"name": "s", "sequence_batching": {}})
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        seq.set_dynamic_batching()


def test_tensors_share_memory_and_know_their_types() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("T", array)
    assert tensor.as_numpy() is array and tensor.triton_dtype() == 11 and tensor.is_cpu()
    back = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    assert np.shares_memory(back.as_numpy(), array)
    assert pb_utils.Tensor("S", np.array([b"ab", b"c"])).as_numpy().dtype == object
    with pytest.raises(pb_utils.TritonModelException, match="Please use np.object_"):
        pb_utils.Tensor("U", np.array(["text"]))
    wire = np.frombuffer(b"\x01\x00\x00\x00", dtype=np.int32)  # a read-only request view
    served = pb_utils.Tensor._wrap(Tensor("IN", DataType.INT32, (1,), wire))
    served.as_numpy()[0] += 1  # models may write into their inputs, as on Triton
    assert served.as_numpy().tolist() == [2] and wire.tolist() == [1]
    assert pb_utils.triton_string_to_numpy("TYPE_INT64") is np.int64
    data = pb_utils.serialize_byte_tensor(np.array([b"x", b"yz"], dtype=object))
    assert pb_utils.deserialize_bytes_tensor(data.tobytes()).tolist() == [b"x", b"yz"]
    assert pb_utils.TritonError("m").code() == pb_utils.TritonError.INTERNAL


def write_model(tmp: Path, name: str, config: str, source: str) -> Path:
    (tmp / name / "1").mkdir(parents=True)
    (tmp / name / "config.pbtxt").write_text(config)
    (tmp / name / "1" / "model.py").write_text(textwrap.dedent(source))
    return tmp / name


AUTO = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.set_max_batch_size(4)
            config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
            config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]})
            config.set_dynamic_batching()
            config.set_model_transaction_policy(dict(decoupled=True))
            return config

        def execute(self, requests):
            return None
"""


def test_auto_complete_config_fills_the_typed_config(tmp_path: Path) -> None:
    path = write_model(tmp_path, "auto", 'backend: "python"\n', AUTO)
    config, versions = read_model_config(path, "auto", backends=get_factory)
    assert versions == [1]
    assert config.max_batch_size == 4 and config.batching is not None and config.decoupled
    assert config.inputs[0].name == "IN" and config.inputs[0].datatype is DataType.INT32
    assert config.platform_name == "python"


BEHAVIOUR = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.args = args

        def execute(self, requests):
            mode = int(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
            if mode == 0:
                raise KeyError("boom")
            if mode == 1:
                return []
            if mode == 2:
                return ["not a response"]
            if mode == 3:
                for r in requests:
                    sender = r.get_response_sender()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([3]))]),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([mode])),
                                                pb_utils.Tensor("EXTRA", np.array([0]))])
                    for r in requests]
"""


async def run_one(instance: Any, mode: int) -> Any:
    send, receive = trio.open_memory_channel[Any](math.inf)
    data = np.array([mode], dtype=np.int64)
    request = InferenceRequest("b", "", {"IN": Tensor("IN", DataType.INT64, (1,), data)}, id="r")
    answers = instance.execute_requests([InferWork(request, send, 1, time.monotonic_ns())])
    await trio.sleep(0.01)  # let sender deliveries (run_sync_soon) arrive
    got = []
    while True:
        try:
            got.append(receive.receive_nowait())
        except trio.WouldBlock:
            break
    return answers, got


async def test_execute_answers_become_responses_or_errors(tmp_path: Path) -> None:
    config_text = ('backend: "python"\ninput [ { name: "IN" data_type: TYPE_INT64 dims: [1] } ]\n'
                   'output [ { name: "OUT" data_type: TYPE_INT64 dims: [1] } ]\n')
    path = write_model(tmp_path, "b", config_text, BEHAVIOUR)
    config, _ = read_model_config(path, "b", backends=get_factory)
    placement = InstancePlacement("b_0", 0, "cpu", 0)
    instance = THREADED.load(config, path / "1", placement)
    assert instance._model.args["model_instance_name"] == "b_0"  # the default group "b"
    assert instance._model.args["model_repository"] == str(path)

    answers, _ = await run_one(instance, 0)
    assert isinstance(answers[0], InternalError)
    assert answers[0].message.startswith("Failed to process the request(s) for model "
                                         "'b_0', message: KeyError: 'boom'\n\nAt:\n")
    answers, _ = await run_one(instance, 1)
    assert answers[0].message == (  # Triton's words, its prefix and its trailing newline
        "Failed to process the request(s) for model 'b_0', message: Number of "
        "InferenceResponse objects do not match the number of InferenceRequest objects. "
        "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0\n")
    answers, _ = await run_one(instance, 2)
    assert "Expected an 'InferenceResponse' object" in answers[0].message
    answers, got = await run_one(instance, 3)  # answered through the sender
    assert answers == [None] and isinstance(got[0], InferenceResponse)
    answers, _ = await run_one(instance, 7)  # only the configured/requested outputs
    assert [t.name for t in answers[0].outputs] == ["OUT"] and answers[0].id == "r"
    instance.close()


async def test_decoupled_model_must_return_none(tmp_path: Path) -> None:
    config_text = ('backend: "python"\nmodel_transaction_policy { decoupled: true }\n'
                   'input [ { name: "IN" data_type: TYPE_INT64 dims: [1] } ]\n'
                   'output [ { name: "OUT" data_type: TYPE_INT64 dims: [1] } ]\n')
    path = write_model(tmp_path, "d", config_text, BEHAVIOUR)
    config, _ = read_model_config(path, "d", backends=get_factory)
    instance = THREADED.load(config, path / "1", InstancePlacement("d_0", 0, "cpu", 0))
    answers, _ = await run_one(instance, 7)
    assert "is using the decoupled mode and the execute function must return None" in (
        answers[0].message)
    answers, got = await run_one(instance, 3)
    assert answers == [None] and isinstance(got[0], Part) and got[0].final


def test_initialize_failure_is_a_load_failure(tmp_path: Path) -> None:
    source = """
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("cannot start")
    """
    config_text = ('backend: "python"\ninput [ { name: "IN" data_type: TYPE_INT64 dims: [1] } ]\n'
                   'output [ { name: "OUT" data_type: TYPE_INT64 dims: [1] } ]\n')
    path = write_model(tmp_path, "f", config_text, source)
    config, _ = read_model_config(path, "f", backends=get_factory)
    with pytest.raises(NurseryError) as raised:
        THREADED.load(config, path / "1", InstancePlacement("f_0", 0, "cpu", 0))
    assert raised.value.kind is ErrorKind.INTERNAL
    assert raised.value.message.startswith("RuntimeError: cannot start\n\nAt:\n")
    assert "model.py(4): initialize" in raised.value.message


def test_logger_level_constants_as_triton_models_write_them() -> None:
    logger = pb_utils.Logger
    assert (logger.INFO, logger.WARNING, logger.ERROR, logger.VERBOSE) == (
        pb_utils.LogLevel.INFO, pb_utils.LogLevel.WARNING, pb_utils.LogLevel.ERROR,
        pb_utils.LogLevel.VERBOSE)
    logger.log("a line at warning level", logger.WARNING)  # the form Triton's examples use


class _Instance:
    model_name = "m"

    def __init__(self, decoupled: bool) -> None:
        self.decoupled = decoupled

    def convert(self, response: Any, request: Any, sent: bool = False) -> Any:
        return response


@pytest.mark.parametrize("decoupled", [False, True])
def test_response_sender_rules_and_messages(decoupled: bool) -> None:
    """Triton's ResponseSender checks, in its order and with its words."""
    from nursery.backends.python.sender import ResponseSender

    got: list[Any] = []
    request = InferenceRequest("m", "", {})
    sender = ResponseSender(got.append, request, _Instance(decoupled), lambda: False)
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    with pytest.raises(pb_utils.TritonModelException, match="^Unable to send response. "
                       "Unsupported flag provided.$"):
        sender.send(pb_utils.InferenceResponse([]), flags=2)
    with pytest.raises(pb_utils.TritonModelException, match="^Inference Response object must "
                       "be provided when the response flags is set to zero.$"):
        sender.send()
    if not decoupled:
        with pytest.raises(pb_utils.TritonModelException, match="Non-decoupled model cannot "
                           "send complete final before sending a response."):
            sender.send(flags=final)
    sender.send(pb_utils.InferenceResponse([]))
    if not decoupled:
        with pytest.raises(pb_utils.TritonModelException, match="Non-decoupled model cannot "
                           "send more than one response."):
            sender.send(pb_utils.InferenceResponse([]))
    sender.send(flags=final)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(flags=final)
    if decoupled:
        assert [(p.final, p.response is not None) for p in got] == [(False, True), (True, False)]
    else:
        assert len(got) == 1 and isinstance(got[0], pb_utils.InferenceResponse)


@pytest.mark.parametrize(("source", "message"), [
    ("""
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                raise ValueError("no shapes known")
     """, "model 'c': auto_complete_config failed: ValueError: no shapes known"),
    ("""
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                return {"max_batch_size": 2}
     """, "auto_complete_config function in model 'c' must return a valid pb.ModelConfig "
          "object."),
    ("""
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.set_max_batch_size(0)
     """, "auto_complete_config function in model 'c' must return a valid pb.ModelConfig "
          "object."),
    ("""
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [1],
                                   "optional": True})
                return config
     """, "model 'c': auto_complete_config failed: ValueError: output 'O' in "
          "auto-complete-config function for model 'c' contains property other than 'name', "
          "'data_type' and 'dims'."),
    ("""
        import os
        os._exit(3)
     """, "model 'c': the stub process completing its configuration failed (exit code 3)"),
])
def test_auto_complete_in_a_stub_reports_failures(tmp_path: Path, source: str,
                                                  message: str) -> None:
    """auto_complete_config in a stub process of its own (models in process mode): what goes
    wrong there fails the load with the reason, the server untouched."""
    from nursery.backends.python.process import complete_in_stub
    from nursery.errors import ConfigError

    path = write_model(tmp_path, "c", 'backend: "python"\n', source)
    with pytest.raises(ConfigError) as raised:
        complete_in_stub(path / "1" / "model.py", "c", str(path / "1"), {"name": "c"})
    assert raised.value.message.startswith(message), raised.value.message
    done = complete_in_stub(write_model(tmp_path / "ok", "c", "", AUTO) / "1" / "model.py",
                            "c", str(tmp_path), {"name": "c"})
    assert done is not None and done["max_batch_size"] == 4
    assert [i["name"] for i in done["input"]] == ["IN"]


def test_memory_limit_sizes() -> None:
    from nursery.backends.python.process import parse_size
    from nursery.errors import ConfigError

    assert parse_size("512M", "x") == 512 << 20 and parse_size("2G", "x") == 2 << 30
    assert parse_size("1GiB", "x") == 1 << 30 and parse_size("300MB", "x") == 300 << 20
    assert parse_size("4096", "x") == 4096 and parse_size("1.5k", "x") == 1536
    for bad in ("", "lots", "-1M", "0"):
        with pytest.raises(ConfigError, match="^x: expected a size"):
            parse_size(bad, "x")


def test_stub_names_triton_refuses() -> None:
    """Triton's Python backend refuses a stub name holding any of ``;|&$`<>()[]{}\\"'*?~#!``
    (characters a shell reads), before any process starts."""
    from nursery.backends.python.process import check_stub_name
    from nursery.errors import ConfigError

    for name in ("model_0_0", "model-with-hyphens_0_0", "TestModel123", "a.b", "m@x", "m%y"):
        check_stub_name(name)
    for char in ";|&$`<>()[]{}\\\"'*?~#!":
        with pytest.raises(ConfigError, match=r"^Invalid stub name: contains invalid characters$"):
            check_stub_name(f"model{char}test_0_0")
    with pytest.raises(ConfigError, match="^Invalid stub name"):
        check_stub_name("")


def test_arguments_are_checked_as_tritons_bindings_check_them() -> None:
    """What the stub's bindings cannot convert (None for a required value, a wrong type) is
    a TypeError; what they pass on and the stub refuses is a TritonModelException."""
    one = [pb_utils.Tensor("IN", np.array([1], np.int32))]
    request = {"model_name": "m", "inputs": one, "requested_output_names": ["OUT"]}
    for key, value in (("inputs", None), ("model_name", None), ("requested_output_names", None),
                       ("requested_output_names", [None]), ("correlation_id", None),
                       ("request_id", None), ("model_version", None), ("flags", None),
                       ("timeout", None), ("inputs", [1])):
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**{**request, key: value})
    with pytest.raises(TypeError, match="missing required argument 'inputs'"):
        pb_utils.InferenceRequest(model_name="m", requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="should not be empty"):
        pb_utils.InferenceRequest(**{**request, "inputs": [None]})
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID must be"):
        pb_utils.InferenceRequest(**request, correlation_id=1.5)
    assert pb_utils.InferenceRequest(**request, correlation_id="s-1").correlation_id() == "s-1"
    assert pb_utils.InferenceRequest(**request).correlation_id() == 0
    pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    # bytes convert to a std::string as a str does (Triton's qa bls_simple passes the
    # as_numpy() element of a BYTES input as the model name)
    from_bytes = pb_utils.InferenceRequest(model_name=b"m", inputs=one, request_id=b"r",
                                           requested_output_names=[b"OUT"])
    assert (from_bytes.model_name(), from_bytes.request_id(),
            from_bytes.requested_output_names()) == ("m", "r", ["OUT"])
    assert pb_utils.Tensor(b"IN", np.array([1])).name() == "IN"

    with pytest.raises(pb_utils.TritonModelException, match="should not be empty"):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    assert pb_utils.InferenceResponse().output_tensors() == []
    assert len(pb_utils.InferenceResponse(one).output_tensors()) == 1

    for name, array in ((None, np.array([1])), ("OUT", None), ("", None)):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, array)  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="cannot be an empty string"):
        pb_utils.Tensor("", np.array([1]))
    for name in ("OUT", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, None)

    logger = pb_utils.Logger
    for call in (lambda: logger.log("x", None), lambda: logger.log("x", 1),
                 lambda: logger.log_info(None), lambda: logger.log_warn(None),
                 lambda: logger.log_error(None), lambda: logger.log_verbose(None)):
        with pytest.raises(TypeError):
            call()
    logger.log("no level given")
    assert logger.LogLevel.ERROR is logger.ERROR


def test_a_metric_outlives_its_family_object_only_as_an_error() -> None:
    """Deleting a MetricFamily before its metrics makes them refuse every operation with
    Triton's words; another object of the same family keeps working."""
    from nursery.observability.custom_metrics import CustomMetrics
    from nursery.runtime.thread_context import bind_context

    class Context:
        custom_metrics = CustomMetrics()

    bind_context(Context())
    try:
        family = pb_utils.MetricFamily("lifetime", "first", pb_utils.MetricFamily.GAUGE)
        again = pb_utils.MetricFamily("lifetime", "second", pb_utils.MetricFamily.GAUGE)
        metric = family.Metric(labels={"a": "1"})
        kept = again.Metric(labels={"a": "2"})
        metric.set(3)
        del family
        for call in (lambda: metric.set(1), lambda: metric.increment(1), metric.value):
            with pytest.raises(pb_utils.TritonModelException,
                               match="^Invalid metric operation as the corresponding "
                                     "'MetricFamily' has been deleted"):
                call()
        kept.increment(2)
        assert kept.value() == 2
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.MetricFamily("lifetime", "x", pb_utils.MetricFamily.COUNTER)
        histogram = pb_utils.MetricFamily("lifetime_h", "h", pb_utils.MetricFamily.HISTOGRAM)
        with pytest.raises(pb_utils.TritonModelException):
            histogram.Metric(labels={}, buckets=[2.0, 1.0])
        histogram.Metric(labels={}, buckets=[])
    finally:
        bind_context(None)


def test_response_iterator_replays_once_read_to_the_end() -> None:
    """Triton's ResponseIterator: ``next()`` and ``for`` share one position; once the last
    response has been read, a new ``for`` starts again from the first."""
    def stream() -> Any:
        for value in range(4):
            out = Tensor("OUT", DataType.INT32, (1,), np.array([value], np.int32))
            yield Part(InferenceResponse("m", "1", [out]), None, False)
        yield Part(None, None, True)  # a bare final flag: an empty final response

    def values(responses: Any) -> list[Any]:
        return [r.output_tensors()[0].as_numpy()[0] if r.output_tensors() else None
                for r in responses]

    responses = pb_utils.ResponseIterator(stream(), "m")
    assert values([next(responses)]) == [0]
    assert values(responses) == [1, 2, 3, None]  # the rest
    with pytest.raises(StopIteration):
        next(responses)
    assert values(responses) == [0, 1, 2, 3, None]  # again, from the first
    for count, _ in enumerate(responses, 1):
        if count == 2:
            break
    assert values([next(responses)]) == [2]
    assert values(responses) == [3, None]  # resumed where it stopped


def test_bls_request_carries_the_sequence() -> None:
    """A BLS request's correlation ID and sequence flags reach the target's sequence batcher
    as a client's would."""
    one = [pb_utils.Tensor("IN", np.array([1], np.int32))]
    start = pb_utils.InferenceRequest(
        model_name="seq", inputs=one, requested_output_names=["OUT"], correlation_id=1000,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)._to_nursery()
    assert (start.sequence_id, start.sequence_start, start.sequence_end) == (1000, True, False)
    end = pb_utils.InferenceRequest(
        model_name="seq", inputs=one, requested_output_names=["OUT"], correlation_id="s-1",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)._to_nursery()
    assert (end.sequence_id, end.sequence_start, end.sequence_end) == ("s-1", False, True)
    assert "sequence_id" not in end.parameters


def test_request_trace_and_bls_requests_in_its_trace() -> None:
    """``request.trace()`` and ``InferenceRequest(..., trace=...)`` as Triton's stub has them:
    a served request's trace (the live one on a server thread, its link in a stub) makes a
    BLS request its child; without it, or with an untraced request's, the BLS request is
    never traced; ``trace`` must be an InferenceTrace (None too is refused, as the bindings
    refuse it)."""
    manager = TraceManager(replace(TraceSettings(), trace_level=("TIMESTAMPS",), trace_rate=1))
    live = manager.start("bls")
    assert live is not None
    one = [pb_utils.Tensor("IN", np.array([1], np.int32))]
    for trace, context in ((live, None), (TraceLink(live.id, '{"traceparent": "x"}'),
                                          '{"traceparent": "x"}')):
        served = pb_utils.InferenceRequest._served(
            InferenceRequest("bls", "1", {}, trace=trace), [], None)  # type: ignore[arg-type]
        assert served.trace().get_context() == context
        child = pb_utils.InferenceRequest(model_name="m", inputs=one, requested_output_names=[],
                                          trace=served.trace())._to_nursery()
        assert child.trace == ChildOf(trace)
        spawned = manager.spawn(child.trace, "m")
        assert isinstance(spawned, Trace) and spawned.parent_id == live.id
        assert spawned.id != live.id and spawned.records()[0]["parent_id"] == live.id
    untraced = pb_utils.InferenceRequest._served(
        InferenceRequest("bls", "1", {}, trace=False), [], None)  # type: ignore[arg-type]
    assert untraced.trace().get_context() is None
    for trace_arg in ({"trace": untraced.trace()}, {}):
        assert pb_utils.InferenceRequest(model_name="m", inputs=one, requested_output_names=[],
                                         **trace_arg)._to_nursery().trace is False
    for wrong in (None, "trace"):
        with pytest.raises(TypeError, match="'trace' must be an InferenceTrace"):
            pb_utils.InferenceRequest(model_name="m", inputs=one, requested_output_names=[],
                                      trace=wrong)
    # a parent no longer in flight: its child is not traced
    assert manager.spawn(ChildOf(TraceLink(10_000)), "m") is False


@pytest.mark.parametrize(("source", "may"), [
    ("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n", False),
    ("import numpy as np\n\n\nclass TritonPythonModel(object):\n    pass\n", True),  # a base
    ("class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n"
     "        return c\n", True),
    ("# auto_complete_config is not defined here\nclass TritonPythonModel:\n    pass\n", True),
    ("from helpers import TritonPythonModel\n", True),  # imported: unknown
    ("TritonPythonModel = type('T', (), {})\n", True),  # assigned: unknown
    ("@decorate\nclass TritonPythonModel:\n    pass\n", True),  # a decorator may add it
    ("class TritonPythonModel(metaclass=M):\n    pass\n", True),
    ("class TritonPythonModel:\n    pass\nclass TritonPythonModel:\n    pass\n", True),
    ("def broken(:\n", True),  # unparsable: the stub says why
    ("x = 1\n", True),  # no class at all: the stub says so
])
def test_a_stub_completes_the_config_unless_model_py_cannot_have_the_method(
        tmp_path: Path, source: str, may: bool) -> None:
    """``may_complete``: the auto-complete stub process is left out only where reading
    ``model.py`` proves it has no ``auto_complete_config`` (the load then costs one process
    less); in any doubt the stub runs it as before."""
    script = tmp_path / "model.py"
    script.write_text(source)
    assert python_backend.may_complete(script) is may
    assert python_backend.may_complete(tmp_path / "missing.py") is True
