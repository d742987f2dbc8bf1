"""BLS from threads the model starts itself (Triton's qa bls model sends two sequences from
two threads): three threads each call ``add_sub`` with IN + k; OUTPUT0's first values."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def add_one(value, sums, index):
    ones = np.ones([1, 16], np.float32)
    request = pb_utils.InferenceRequest(
        model_name="add_sub", requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor("INPUT0", ones * value), pb_utils.Tensor("INPUT1", ones)])
    response = request.exec()
    sums[index] = -1.0 if response.has_error() else float(
        pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()[0, 0])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sums = [0.0] * 3
            workers = [threading.Thread(target=add_one, args=(value + k, sums, k))
                       for k in range(3)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array(sums, np.float32))]))
        return responses
