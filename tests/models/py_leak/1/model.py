import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Leaks: each request allocates MIB mebibytes and keeps them; a request of more than
    100 MiB then waits (up to 30 s) for the memory limit to end its stub. PID: the stub's
    process id."""

    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        responses = []
        for request in requests:
            mib = int(pb_utils.get_input_tensor_by_name(request, "MIB").as_numpy()[0])
            self.kept.append(np.ones(mib << 20, dtype=np.uint8))  # written: resident
            if mib > 100:
                time.sleep(30)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))]))
        return responses
