"""A Python-based stand-in for Triton's `sequence` C++ test backend (server/src/test/sequence),
which Triton's qa image builds for `custom_sequence_int32` (L0_sequence_stress, L0_lifecycle,
L0_sequence_batcher, L0_rate_limiter). The harness puts it at `<backend dir>/sequence/model.py`.

Behaviour, as that backend documents it: an INT32 accumulator per sequence, driven by the
sequence batcher's START and READY control inputs. READY=0 leaves it alone and answers no
output; READY=1 with START=1 sets it to the sum of INPUT's elements, with START=0 adds that
sum; with READY=1 the accumulator fills every element of OUTPUT (shaped as INPUT). Each
execution first sleeps the model's `execute_delay_ms` parameter; a request whose INPUT holds
more than one timestep is refused.

The C++ backend keeps one accumulator per batch slot of each instance, the slot being the
request's index in the batch (the direct scheduler pads the batch with null requests). A
Python model sees no slot, so this one keys its accumulators by the request's correlation ID,
per instance: a sequence that strays to another instance, or whose steps are reordered, gives
a wrong sum, as it would under the C++ backend.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return 0 if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("execute_delay_ms", {}).get("string_value")
        self.delay_s = int(delay) / 1000.0 if delay else 0.0
        self.batching = config.get("max_batch_size", 0) > 0
        self.accumulators = {}

    def execute(self, requests):
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if self.batching and values.ndim > 0 and values.shape[0] != 1:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "unable to execute more than one timestep at a time",
                    pb_utils.TritonError.UNSUPPORTED)))
                continue
            if not _flag(request, "READY"):
                responses.append(pb_utils.InferenceResponse([]))
                continue
            key = request.correlation_id()
            # int32 arithmetic, wrapping as the C++ accumulator does
            with np.errstate(over="ignore"):
                total = values.astype(np.int32).sum(dtype=np.int32)
                if not _flag(request, "START"):
                    total = np.int32(self.accumulators.get(key, np.int32(0)) + total)
            value = total
            self.accumulators[key] = value
            output = np.full(values.shape, value, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses
