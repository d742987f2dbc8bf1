import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request with its parameters, as ``request.parameters()`` gives them (a
    JSON string, as in Triton): custom parameters and forwarded headers."""

    def execute(self, requests):
        responses = []
        for request in requests:
            text = np.array([request.parameters().encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMETERS", text)]))
        return responses
