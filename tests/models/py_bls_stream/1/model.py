import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A decoupled pipeline: each response of the decoupled py_repeat (a BLS stream) is
    forwarded at once, doubled, through this model's own response sender."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            infer_request = pb_utils.InferenceRequest(
                model_name="py_repeat",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"])
            for infer_response in infer_request.exec(decoupled=True):
                if infer_response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=infer_response.error()))
                elif infer_response.output_tensors():
                    out = pb_utils.get_output_tensor_by_name(infer_response, "OUT").as_numpy()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("DOUBLED", out * 2)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
