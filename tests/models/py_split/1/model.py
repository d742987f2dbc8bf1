"""A model split over several files: model.py imports its helpers relatively."""

import triton_python_backend_utils as pb_utils

from .helpers import double


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", double(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()))])
            for r in requests]
