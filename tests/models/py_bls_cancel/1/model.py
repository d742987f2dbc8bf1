import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams py_until_cancelled over BLS, adding up its responses; once the sum reaches
    MAX_SUM, cancels the stream with the iterator's cancel() and reads on until the end.
    SUM, whether a CANCELLED response came, and what a cancel() after the end raised
    (empty: nothing)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN")
            max_sum = int(pb_utils.get_input_tensor_by_name(request, "MAX_SUM").as_numpy()[0])
            stream = pb_utils.InferenceRequest(
                model_name="py_until_cancelled", inputs=[value],
                requested_output_names=["OUT"]).exec(decoupled=True)
            total, cancelled, error = 0, False, None
            for response in stream:
                if response.has_error():
                    if response.error().code() == pb_utils.TritonError.CANCELLED:
                        cancelled = True
                    else:
                        error = response.error()
                    break
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is None:
                    break  # the empty final response
                total += int(out.as_numpy()[0])
                if total >= max_sum:
                    stream.cancel()
            after = ""
            try:
                stream.cancel()
            except Exception as exc:
                after = str(exc)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
                pb_utils.Tensor("IS_CANCELLED", np.array([cancelled], dtype=np.bool_)),
                pb_utils.Tensor("AFTER_END", np.array([after.encode()], dtype=np.object_)),
            ], error=error))
        return responses
