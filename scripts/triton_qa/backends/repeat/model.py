"""A Python-based stand-in for Triton's `repeat` C++ test backend
(github.com/triton-inference-server/repeat_backend), which Triton's qa image builds and
L0_decoupled, L0_trace and others serve (`repeat_int32`). The harness puts it at
`<backend dir>/repeat/model.py`, where Triton (and nursery) look for a Python-based backend
named `repeat`.

Behaviour, as that backend does it: the model must have max_batch_size 0, inputs IN (INT32,
one dimension), DELAY (UINT32, IN's shape) and WAIT (UINT32, [1]), outputs OUT (INT32, [1]) and
IDX (UINT32, [1]). For each request it answers once per element of IN, from a thread of its
own: it waits DELAY[i] milliseconds, then sends OUT = [IN[i]] and IDX = [i]; after the last it
sends the final flag (with no response when IN is empty). ``execute`` itself waits WAIT
milliseconds before it returns. Like the C++ backend it does not look at the model's
transaction policy: a model that is not decoupled gets its one response the same way.
"""
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_EXPECTED = (("input", 0, "IN", "TYPE_INT32", "first input"),
             ("input", 1, "DELAY", "TYPE_UINT32", "second input"),
             ("input", 2, "WAIT", "TYPE_UINT32", "third input"),
             ("output", 0, "OUT", "TYPE_INT32", "first output"),
             ("output", 1, "IDX", "TYPE_UINT32", "second output"))


def _dims(tensor):
    return [int(d) for d in tensor.get("dims", [])]


def _shape(dims):
    """A shape as the C++ backends print it."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def _check_config(config):
    if config.get("max_batch_size", 0) != 0:
        raise pb_utils.TritonModelException(
            "repeat backend only supports models with max_batch_size == 0")
    inputs, outputs = config.get("input", []), config.get("output", [])
    if len(inputs) != 3:
        raise pb_utils.TritonModelException(f"expected 3 inputs, got {len(inputs)}")
    if len(outputs) != 2:
        raise pb_utils.TritonModelException(f"expected 2 outputs, got {len(outputs)}")
    for kind, index, name, _datatype, what in _EXPECTED:
        tensor = (inputs if kind == "input" else outputs)[index]
        if tensor["name"] != name:
            raise pb_utils.TritonModelException(
                f"expected {what} tensor name to be {name}, got {tensor['name']}")
    by_name = {t["name"]: t for t in inputs + outputs}
    if len(_dims(by_name["IN"])) != 1:
        raise pb_utils.TritonModelException(
            f"expected IN shape to have one dimension, got {_shape(_dims(by_name['IN']))}")
    if _dims(by_name["IN"]) != _dims(by_name["DELAY"]):
        raise pb_utils.TritonModelException(
            f"expected IN and DELAY shape to match, got {_shape(_dims(by_name['IN']))} and "
            f"{_shape(_dims(by_name['DELAY']))}")
    for name in ("WAIT", "OUT", "IDX"):
        if _dims(by_name[name]) != [1]:
            raise pb_utils.TritonModelException(
                f"expected {name} shape to be [1], got {_shape(_dims(by_name[name]))}")
    for _, _, name, datatype, _ in _EXPECTED:
        if by_name[name]["data_type"] != datatype:
            raise pb_utils.TritonModelException(
                f"expected {name} datatype to be {datatype[len('TYPE_'):]}, got "
                f"{by_name[name]['data_type']}")


class TritonPythonModel:
    def initialize(self, args):
        _check_config(json.loads(args["model_config"]))
        self.inflight = 0
        self.lock = threading.Condition()

    def execute(self, requests):
        if len(requests) > 1:
            raise pb_utils.TritonModelException(
                "repeat backend does not support batched request execution")
        wait_ms = 0
        for request in requests:
            wait_ms = self._start(request)
        time.sleep(wait_ms / 1000)
        return None

    def _start(self, request):
        """Starts the answering thread of one request; returns its WAIT (0 on an error)."""
        sender = request.get_response_sender()

        def refuse(message):
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                message, pb_utils.TritonError.INVALID_ARG)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return 0

        wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
        if wait.size != 1:
            return refuse("unexpected size for WAIT input")
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        if values.shape != delays.shape:
            return refuse(f"expected IN and DELAY shape to match, got {_shape(values.shape)} "
                          f"and {_shape(delays.shape)}")
        with self.lock:
            self.inflight += 1
        threading.Thread(target=self._answer, args=(sender, values.reshape(-1).copy(),
                                                    delays.reshape(-1).copy()),
                         daemon=True).start()
        return int(wait.reshape(-1)[0])

    def _answer(self, sender, values, delays):
        try:
            for i, (value, delay) in enumerate(zip(values, delays, strict=True)):
                time.sleep(int(delay) / 1000)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.inflight -= 1
                self.lock.notify_all()

    def finalize(self):
        with self.lock:  # as the C++ backend, wait for the answers still being sent
            while self.inflight:
                self.lock.wait()
