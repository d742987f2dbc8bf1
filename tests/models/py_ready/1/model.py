import asyncio
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Identity with an ``is_ready()`` that reads the file ``ready_state`` beside the model's
    config on every check: "true" / "false" answer that; "raise" raises; "number" returns 1
    (not a bool); "slow" takes 6 s, then answers ready. With the parameter ``async_is_ready`` the hook is an
    ``async def``."""

    def initialize(self, args):
        self.state_file = os.path.join(args["model_repository"], "ready_state")
        config = json.loads(args["model_config"])
        if "async_is_ready" in config.get("parameters", {}):
            self.is_ready = self._is_ready_async

    def _answer(self):
        try:
            with open(self.state_file) as f:
                state = f.read().strip()
        except FileNotFoundError:
            state = "true"
        if state == "raise":
            raise ValueError("the dependency is down")
        if state == "number":
            return 1
        if state == "slow":
            time.sleep(6)
            return True
        return state == "true"

    def is_ready(self):
        return self._answer()

    async def _is_ready_async(self):
        await asyncio.sleep(0)
        return self._answer()

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
