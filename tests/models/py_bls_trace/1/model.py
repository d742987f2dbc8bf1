import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's qa bls_simple (L0_trace): calls the model named in MODEL_NAME with BLS as
    part of its own request's trace (``trace=request.trace()``), and answers that trace's
    OpenTelemetry context in CONTEXT ("" when there is none)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            # bytes, passed on as they are (Triton's bindings take them for a str)
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            child = pb_utils.InferenceRequest(
                model_name=name,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                trace=request.trace(),
            )
            answer = child.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            context = request.trace().get_context()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(
                    answer, "OUTPUT0").as_numpy().reshape(1, 16)),
                pb_utils.Tensor("OUTPUT1", pb_utils.get_output_tensor_by_name(
                    answer, "OUTPUT1").as_numpy().reshape(1, 16)),
                pb_utils.Tensor("CONTEXT", np.array([context or ""], dtype=np.object_)),
            ]))
        return responses
