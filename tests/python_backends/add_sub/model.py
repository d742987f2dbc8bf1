import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A Python-based backend (``backend: "add_sub"``, this file in
    ``<backend directory>/add_sub/model.py``): every model that names it reads
    ``model.json`` ({"operation": "add" | "sub"}) from its own version folder
    (``pb_utils.get_model_dir()``); OUTPUT = INPUT0 + INPUT1 or INPUT0 - INPUT1. Its
    ``auto_complete_config`` fills the inputs and the output and leaves the id of the process
    it ran in beside model.json (``autocomplete_pid``)."""

    @staticmethod
    def auto_complete_config(config):
        with open(os.path.join(pb_utils.get_model_dir(), "autocomplete_pid"), "w") as f:
            f.write(str(os.getpid()))
        have = {i["name"] for i in config.as_dict()["input"]}
        for name in ("INPUT0", "INPUT1"):
            if name not in have:
                config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        if not config.as_dict()["output"]:
            config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.operation = json.load(f)["operation"]
        assert self.operation in ("add", "sub"), self.operation

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out = a + b if self.operation == "add" else a - b
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", out.astype(np.float32))]))
        return responses
