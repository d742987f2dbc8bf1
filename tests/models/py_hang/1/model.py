"""A model whose execute never returns once asked to (an input whose first value is negative):
the careless author's infinite loop. Other inputs are answered as identity."""

import json
import pathlib
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.never = threading.Event()
        # a file touched when a request starts hanging (tests wait for it)
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.marker = parameters.get("hang_marker", {}).get("string_value")

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.size and data.flat[0] < 0:
                if self.marker:
                    pathlib.Path(self.marker).touch()
                self.never.wait()  # hangs for good: nothing ever sets it
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses
