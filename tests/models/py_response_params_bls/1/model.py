import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS to py_response_params (PARAMS) and py_response_params_decoupled (PARAMS_DECOUPLED):
    OUTPUT is a JSON list of what each BLS response's ``parameters()`` said, the plain
    model's first, then one per streamed response (the empty final one left out)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = []
            for name, model, decoupled in (("PARAMS", "py_response_params", False),
                                           ("PARAMS_DECOUPLED", "py_response_params_decoupled",
                                            True)):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                call = pb_utils.InferenceRequest(
                    model_name=model, requested_output_names=["OUTPUT"],
                    inputs=[pb_utils.Tensor("PARAMS", tensor.as_numpy())])
                answers = call.exec(decoupled=True) if decoupled else [call.exec()]
                for answer in answers:
                    if answer.has_error():
                        raise pb_utils.TritonModelException(answer.error().message())
                    if decoupled and not answer.output_tensors():
                        continue  # the final, empty response
                    seen.append(json.loads(answer.parameters()))
            output = pb_utils.Tensor("OUTPUT", np.array([json.dumps(seen)], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
