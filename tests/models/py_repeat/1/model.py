import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled, like Triton's repeat example: for each element of IN, one response
    (OUT = the element, IDX = its index), sent from a thread after execute returned, then the
    final flag. A negative element is answered with an error response instead."""

    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                "Model transaction policy must be decoupled for {}".format(args["model_name"]))
        self.inflight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), values))
            thread.daemon = True
            with self.lock:
                self.inflight += 1
            thread.start()
        return None

    def respond(self, sender, values):
        try:
            for idx, value in enumerate(values):
                time.sleep(0.001)
                if value < 0:
                    error = pb_utils.TritonError(f"negative value at {idx}")
                    sender.send(pb_utils.InferenceResponse(error=error))
                    continue
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([idx], dtype=np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.inflight -= 1

    def finalize(self):
        for _ in range(500):
            with self.lock:
                if self.inflight == 0:
                    return
            time.sleep(0.01)
