import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + BIAS, or INPUT0 when the optional BIAS is not given."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            bias = pb_utils.get_input_tensor_by_name(request, "BIAS")
            if bias is not None:
                value = value + bias.as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
