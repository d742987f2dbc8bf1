"""BLS from processes the model forks (``multiprocessing.Pool``, as Triton's qa bls model
does): three workers each call ``add_sub`` with IN + k and answer OUTPUT0's first value."""

from multiprocessing import Pool

import numpy as np
import triton_python_backend_utils as pb_utils


def add_one(value):
    ones = np.ones([1, 16], np.float32)
    request = pb_utils.InferenceRequest(
        model_name="add_sub", requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor("INPUT0", ones * value), pb_utils.Tensor("INPUT1", ones)])
    response = request.exec()
    if response.has_error():
        return -1.0
    return float(pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()[0, 0])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            with Pool(3) as pool:
                sums = pool.map(add_one, [value, value + 1, value + 2])
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array(sums, np.float32))]))
        return responses
