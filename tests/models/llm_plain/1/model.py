import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Not decoupled, TensorRT-LLM's names, no token counts: answers the prompt upper-cased
    (at most ``max_tokens`` words) in one response."""

    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            prompt = prompt.reshape(-1)[0].decode()
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            limit = int(limit.as_numpy().reshape(-1)[0]) if limit is not None else 16
            text = " ".join(prompt.upper().split()[:limit])
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]))
        return responses
