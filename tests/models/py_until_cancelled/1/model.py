import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: sends IN again and again (every 20 ms, at most 500 times) until its request
    is cancelled, then a CANCELLED error response with the final flag."""

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(500):
                if request.is_cancelled():
                    error = pb_utils.TritonError("request has been cancelled",
                                                 pb_utils.TritonError.CANCELLED)
                    sender.send(pb_utils.InferenceResponse(error=error),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array(value, dtype=np.int32))]))
                time.sleep(0.02)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
