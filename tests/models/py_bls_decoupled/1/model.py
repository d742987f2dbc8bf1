import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS with a decoupled model, as in Triton's bls_decoupled example: sums OUT over every
    response py_repeat sends for IN, skipping the empty final response."""

    def execute(self, requests):
        responses = []
        for request in requests:
            infer_request = pb_utils.InferenceRequest(
                model_name="py_repeat",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"])
            total = np.array([0], dtype=np.int32)
            count = np.array([0], dtype=np.int32)
            for infer_response in infer_request.exec(decoupled=True):
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
                if len(infer_response.output_tensors()) > 0:
                    total += pb_utils.get_output_tensor_by_name(infer_response, "OUT").as_numpy()
                    count += 1
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("SUM", total), pb_utils.Tensor("COUNT", count)]))
        return responses
