import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """0 raises (every request of the call fails), 1 returns a TritonError (that request
    fails), anything else is echoed."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if value[0] == 0:
                raise pb_utils.TritonModelException("zero is not allowed")
            if value[0] == 1:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[],
                    error=pb_utils.TritonError("one is refused", pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
