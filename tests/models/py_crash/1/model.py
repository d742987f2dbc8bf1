"""A model that takes its process down when asked to (the first input value): -1 calls
``os._exit(3)``, -2 dereferences a null pointer (SIGSEGV), -3 allocates until the kernel or
Python gives up. Other inputs are answered as identity; each answer carries the process id."""

import ctypes
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            first = data.flat[0] if data.size else 0
            if first == -1:
                os._exit(3)
            if first == -2:
                ctypes.string_at(0)  # a segfault, as a broken C extension would
            out = data.copy()
            out.flat[-1] = os.getpid()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", out.astype(np.float32))]))
        return responses
