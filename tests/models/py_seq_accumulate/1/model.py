import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A stateful model written for Triton's sequence batcher with implicit state: OUTPUT is
    the running sum of the sequence's INPUTs. The batcher gives each request the START, READY
    and CORRID controls and the sequence's state (INPUT_STATE); the model returns the new
    state as OUTPUT_STATE, which the server keeps for the next request of the sequence."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            if int(ready.reshape(-1)[0]) != 1:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("a real request must be READY")))
                continue
            if int(corrid.reshape(-1)[0]) != int(request.correlation_id()):
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("CORRID disagrees with correlation_id()")))
                continue
            if int(start.reshape(-1)[0]) == 1 and int(state.reshape(-1)[0]) != 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("START must see the initial state")))
                continue
            total = (state + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", total),
                pb_utils.Tensor("OUTPUT_STATE", total),
            ]))
        return responses
