"""A Python-based stand-in for Triton's `square` C++ test backend
(github.com/triton-inference-server/square_backend), which Triton's qa image builds and
L0_decoupled (`square_int32`) and L0_response_statistics serve. The harness puts it at
`<backend dir>/square/model.py`, where Triton (and nursery) look for a Python-based backend
named `square`.

Behaviour, as that backend does it: one input IN and one output OUT, both INT32 with dims
[1]. A request whose IN holds n (shape [1], or [1, 1]) gets n responses, each OUT = [n] (in
IN's number of dimensions), from a thread of its own, then the final flag; n = 0 sends only
the final flag. The model parameters CUSTOM_INFER_DELAY_NS (slept before each response),
CUSTOM_OUTPUT_DELAY_NS (after building it), CUSTOM_CANCEL_DELAY_NS (slept instead of the infer
delay once the request is cancelled), CUSTOM_FAIL_COUNT and CUSTOM_EMPTY_COUNT (the last
responses: that many fail with "simulated failure", then that many are not sent at all) are
honoured. Once the request is cancelled it sleeps the cancel delay and sends only the final
flag. The per-response
statistics the C++ backend reports itself (its compute-infer / compute-output split) are not:
a Python model has no way to report them (nursery measures each response as it comes).
"""
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _shape(dims):
    """A shape as the C++ backends print it."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def _check_config(config):
    inputs, outputs = config.get("input", []), config.get("output", [])
    if len(inputs) != 1:
        raise pb_utils.TritonModelException(f"expected 1 input, got {len(inputs)}")
    if len(outputs) != 1:
        raise pb_utils.TritonModelException(f"expected 1 output, got {len(outputs)}")
    tensor_in, tensor_out = inputs[0], outputs[0]
    if tensor_in["name"] != "IN":
        raise pb_utils.TritonModelException(
            f"expected first input tensor name to be IN, got {tensor_in['name']}")
    if tensor_out["name"] != "OUT":
        raise pb_utils.TritonModelException(
            f"expected first output tensor name to be OUT, got {tensor_out['name']}")
    for name, tensor in (("IN", tensor_in), ("OUT", tensor_out)):
        dims = [int(d) for d in tensor.get("dims", [])]
        if dims != [1]:
            raise pb_utils.TritonModelException(
                f"expected {name} shape to be [1], got {_shape(dims)}")
    for name, tensor in (("IN", tensor_in), ("OUT", tensor_out)):
        if tensor["data_type"] != "TYPE_INT32":
            raise pb_utils.TritonModelException(
                f"expected {name} datatype to be INT32, got {tensor['data_type']}")


def _parameter(config, key):
    """A non-negative integer parameter (0 when absent or not a number, as the C++ backend
    reads it)."""
    value = config.get("parameters", {}).get(key)
    text = value.get("string_value", "") if isinstance(value, dict) else ""
    return int(text) if text.isdigit() else 0


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        _check_config(config)
        self.infer_delay = _parameter(config, "CUSTOM_INFER_DELAY_NS") / 1e9
        self.output_delay = _parameter(config, "CUSTOM_OUTPUT_DELAY_NS") / 1e9
        self.cancel_delay = _parameter(config, "CUSTOM_CANCEL_DELAY_NS") / 1e9
        self.fail_count = _parameter(config, "CUSTOM_FAIL_COUNT")
        self.empty_count = _parameter(config, "CUSTOM_EMPTY_COUNT")
        self.inflight = 0
        self.lock = threading.Condition()

    def execute(self, requests):
        for request in requests:
            self._start(request)
        return None

    def _start(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        if values.ndim == 2 and values.shape[0] != 1:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "unexpected shape for IN input", pb_utils.TritonError.INVALID_ARG)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        with self.lock:
            self.inflight += 1
        threading.Thread(target=self._answer,
                         args=(request, sender, int(values.reshape(-1)[0]), values.ndim),
                         daemon=True).start()

    def _answer(self, request, sender, count, ndim):
        try:
            for index in range(count):
                cancelled = request.is_cancelled()
                time.sleep(self.cancel_delay if cancelled else self.infer_delay)
                if cancelled:  # no response for it: the final flag follows
                    break
                if index + self.fail_count + self.empty_count < count:  # a success
                    out = pb_utils.Tensor("OUT", np.full([1] * ndim, count, dtype=np.int32))
                    time.sleep(self.output_delay)
                    sender.send(pb_utils.InferenceResponse([out]))
                elif index + self.empty_count < count:  # a simulated failure
                    time.sleep(self.output_delay)
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "simulated failure", pb_utils.TritonError.UNKNOWN)))
                # else: an empty response, not sent
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.inflight -= 1
                self.lock.notify_all()

    def finalize(self):
        with self.lock:  # as the C++ backend, wait for the answers still being sent
            while self.inflight:
                self.lock.wait()
