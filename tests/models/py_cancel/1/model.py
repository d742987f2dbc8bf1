"""A slow model that stops early when its requester goes away: a request whose input is
negative works for up to 30 s, looking at ``request.is_cancelled()`` as it goes; once
cancelled it touches the file named by the ``cancel_marker`` parameter and gives up."""

import json
import pathlib
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.marker = params.get("cancel_marker", {}).get("string_value")

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data[0] < 0:
                end = time.monotonic() + 30
                while time.monotonic() < end and not request.is_cancelled():
                    time.sleep(0.01)
                if request.is_cancelled():
                    if self.marker:
                        pathlib.Path(self.marker).touch()
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)))
                    continue
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses
