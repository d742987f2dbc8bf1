"""A Python-based stand-in for Triton's `iterative_sequence` C++ test backend
(server/src/test/iterative_sequence), which Triton's qa image builds for L0_iterative_sequence.
The harness puts it at `<backend dir>/iterative_sequence/model.py`, where Triton (and nursery)
look for a Python-based backend named `iterative_sequence`.

Behaviour, as that backend documents it: INPUT (INT32 [1]) is how many responses a sequence
gets; each execution answers with how many are left (OUTPUT, the input's shape), waits 500 ms,
and then either releases the request to be scheduled again (more to come) or ends it with the
final flag. The count left is kept by correlation ID. Where the scheduler cannot reschedule
(no iterative sequence batching), the release fails and the response carries the error with
the final flag, as the C++ backend sends it.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remainders = {}
        self.batching = json.loads(args["model_config"]).get("max_batch_size", 0) > 0

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            start = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
                        .reshape(-1)[0])
            corrid = request.correlation_id()
            left = self.remainders.setdefault(corrid, start) - 1
            if left <= 0:
                self.remainders.pop(corrid, None)
            else:
                self.remainders[corrid] = left
            shape = (1, 1) if self.batching else (1,)
            output = pb_utils.Tensor("OUTPUT", np.full(shape, left, dtype=np.int32))
            time.sleep(0.5)
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(pb_utils.InferenceResponse([output]))
            else:
                sender.send(pb_utils.InferenceResponse([output]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
