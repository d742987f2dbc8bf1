import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """async execute: two BLS calls in flight at once (ONNX add_sub and the Python
    py_add_sub); OUTPUT0 = their OUTPUT0s added, OUTPUT1 = the error text check."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            calls = [
                pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                                          inputs=inputs).async_exec()
                for name in ("add_sub", "py_add_sub")
            ]
            missing = pb_utils.InferenceRequest(
                model_name="no_such_model", requested_output_names=["OUTPUT0"], inputs=inputs
            ).async_exec()
            onnx, python, failed = await asyncio.gather(*calls, missing)
            if onnx.has_error() or python.has_error():
                raise pb_utils.TritonModelException("a BLS call failed")
            if not failed.has_error():
                raise pb_utils.TritonModelException("calling an unknown model should fail")
            out0 = (pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0").as_numpy()
                    + pb_utils.get_output_tensor_by_name(python, "OUTPUT0").as_numpy())
            out1 = (pb_utils.get_output_tensor_by_name(onnx, "OUTPUT1").as_numpy()
                    + pb_utils.get_output_tensor_by_name(python, "OUTPUT1").as_numpy())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", out0.astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", out1.astype(np.float32)),
            ]))
        return responses
