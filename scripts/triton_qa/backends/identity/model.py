"""A Python-based stand-in for Triton's `identity` C++ test backend
(github.com/triton-inference-server/identity_backend), which Triton's qa image builds and many
qa groups serve (`custom_*` and `nop_*` models, `identity_*` models). The harness puts it at
`<backend dir>/identity/model.py`, where Triton (and nursery) look for a Python-based backend
named `identity`.

Behaviour, as that backend documents and does it: inputs and outputs are named INPUT<i> and
OUTPUT<i>, and each requested OUTPUT<i> is INPUT<i> unchanged (datatype and shape included).
A requested OUTPUT<i> whose INPUT<i> the request lacks is, when the configuration marks that
input optional, a tensor of zeros of the input's configured datatype and dims (-1 read as 1,
with the request's batch size in front for a batching model), and otherwise an error
("failed to get input 'INPUT<i>'"). The model parameters `execute_delay_ms` (each execution
sleeps that long, times `instance_wise_delay_multiplier` times the instance's index when that
is set) and `creation_delay_sec` (the model takes that long to load) are honoured; its tracing
and metrics extras are not. A KIND_GPU instance is refused with "GPU instances not supported",
as the backend built without GPU support (Triton's qa image's, which L0_lifecycle's reload
case counts on) refuses it.
"""
import json
import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _parameter(config, name):
    value = config.get("parameters", {}).get(name)
    return value.get("string_value") if isinstance(value, dict) else None


def _index(name, prefix):
    return int(name[len(prefix):])


class TritonPythonModel:
    def initialize(self, args):
        if args.get("model_instance_kind") == "GPU":
            raise pb_utils.TritonModelException("GPU instances not supported")
        config = json.loads(args["model_config"])
        creation_delay = _parameter(config, "creation_delay_sec")
        if creation_delay:
            time.sleep(int(creation_delay))
        delay = int(_parameter(config, "execute_delay_ms") or 0)
        multiplier = int(_parameter(config, "instance_wise_delay_multiplier") or 0)
        if delay and multiplier:
            # the instance's index among the model's instances (the last number of its name)
            found = re.search(r"(\d+)$", args.get("model_instance_name", ""))
            delay *= max(multiplier * (int(found.group(1)) if found else 0), 1)
        self.execute_delay_ms = delay
        self.batching = config.get("max_batch_size", 0) > 0
        self.outputs = [o["name"] for o in config.get("output", [])]
        # index -> (numpy dtype, shape) of the inputs the configuration marks optional
        self.optional = {}
        for tensor in config.get("input", []):
            if tensor.get("optional"):
                dims = tensor.get("reshape", {}).get("shape", tensor.get("dims", []))
                self.optional[_index(tensor["name"], "INPUT")] = (
                    pb_utils.triton_string_to_numpy(tensor["data_type"]),
                    [1 if int(d) == -1 else int(d) for d in dims])

    def execute(self, requests):
        if self.execute_delay_ms:
            time.sleep(self.execute_delay_ms / 1000)
        return [self._answer(request) for request in requests]

    def _answer(self, request):
        inputs = {_index(t.name(), "INPUT"): t for t in request.inputs()}
        batch = None
        if self.batching and request.inputs():
            shape = request.inputs()[0].shape()
            batch = shape[0] if len(shape) else None
        tensors = []
        for name in request.requested_output_names() or self.outputs:
            index = _index(name, "OUTPUT")
            if index in inputs:
                tensors.append(pb_utils.Tensor(name, inputs[index].as_numpy()))
            elif index in self.optional:
                dtype, shape = self.optional[index]
                shape = ([batch] if batch else []) + shape
                tensors.append(pb_utils.Tensor(name, np.zeros(shape, dtype=dtype)))
            else:
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"failed to get input 'INPUT{index}'", pb_utils.TritonError.UNSUPPORTED))
        return pb_utils.InferenceResponse(tensors)
