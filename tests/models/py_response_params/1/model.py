import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _parameters(text):
    """The JSON in PARAMS; keys made only of digits become ints (to try non-str keys)."""
    value = json.loads(text)
    if isinstance(value, dict):
        return {int(k) if k.isdigit() else k: v for k, v in value.items()}
    return value


class TritonPythonModel:
    """Answers with the response parameters given as JSON in PARAMS (OUTPUT echoes PARAMS).
    Decoupled (by its config): PARAMS is a list, one response per element. Parameters the
    InferenceResponse refuses are answered with an INVALID_ARG error carrying its message."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def _response(self, params):
        output = pb_utils.Tensor("OUTPUT", np.array([json.dumps(params)], dtype=np.object_))
        try:
            response = pb_utils.InferenceResponse(output_tensors=[output], parameters=params)
            assert json.loads(response.parameters()) == params
        except Exception as exc:
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
            response = pb_utils.InferenceResponse(error=error)
        return response

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy()[0]
            params = _parameters(text.decode())
            if not self.decoupled:
                responses.append(self._response(params))
                continue
            sender = request.get_response_sender()
            for item in params:
                sender.send(self._response(item))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None if self.decoupled else responses
