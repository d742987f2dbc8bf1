"""A Python-based stand-in for Triton's `identity` C++ test backend
(github.com/triton-inference-server/identity_backend), which Triton's qa image builds and many
qa groups serve (`custom_*` and `nop_*` models, `identity_*` models). The harness puts it at
`<backend dir>/identity/model.py`, where Triton (and nursery) look for a Python-based backend
named `identity`.

Behaviour, as that backend documents it: inputs and outputs are named INPUT<i> and OUTPUT<i>,
and OUTPUT<i> is INPUT<i> unchanged (datatype and shape included). The model parameters
`execute_delay_ms` (each execution sleeps that long) and `creation_delay_sec` (each instance
takes that long to start) are honoured; its tracing and statistics extras are not.
"""
import json
import time

import triton_python_backend_utils as pb_utils


def _parameter(config, name):
    value = config.get("parameters", {}).get(name)
    return value.get("string_value") if isinstance(value, dict) else None


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        creation_delay = _parameter(config, "creation_delay_sec")
        if creation_delay:
            time.sleep(int(creation_delay))
        self.execute_delay_ms = int(_parameter(config, "execute_delay_ms") or 0)
        self.outputs = [o["name"] for o in config.get("output", [])]

    def execute(self, requests):
        if self.execute_delay_ms:
            time.sleep(self.execute_delay_ms / 1000)
        responses = []
        for request in requests:
            requested = request.requested_output_names() or self.outputs
            tensors = []
            for name in requested:
                if not name.startswith("OUTPUT"):
                    continue
                tensor = pb_utils.get_input_tensor_by_name(request, "INPUT" + name[len("OUTPUT"):])
                if tensor is not None:
                    tensors.append(pb_utils.Tensor(name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
