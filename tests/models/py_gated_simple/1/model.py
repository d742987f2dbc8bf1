"""Triton's ``simple`` (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1) whose requests
a test holds in flight: a request whose parameters name ``started`` touches that file when it
starts executing and, if they name ``release``, answers only once that file exists (at most
a minute later). Two instances, so two held requests execute side by side."""

import json
import pathlib
import time

import triton_python_backend_utils as pb_utils

MAX_WAIT_S = 60.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            if params.get("started"):
                pathlib.Path(params["started"]).touch()
            release = params.get("release")
            if release:
                give_up = time.monotonic() + MAX_WAIT_S
                while not pathlib.Path(release).exists() and time.monotonic() < give_up:
                    time.sleep(0.01)
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
