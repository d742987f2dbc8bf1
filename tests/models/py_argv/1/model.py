"""Runs its own tests inside ``execute`` with ``unittest.main("model", exit=False)``, as eight
of Triton's qa models do: that works only when ``sys.argv`` is what Triton's stub gives model
code (``['']``). Answers ``sys.argv`` and whether the tests passed."""

import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class ArgvTest(unittest.TestCase):
    def test_input_is_doubled(self):
        self.assertEqual(float(np.array([2.0], np.float32)[0] * 2), 4.0)  # noqa: PT009 - unittest, as Triton's models


class TritonPythonModel:
    def execute(self, requests):
        argv = list(sys.argv)
        result = unittest.main("model", exit=False, argv=None, verbosity=0)
        passed = result.result.wasSuccessful() and result.result.testsRun == 1
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("ARGV", np.array([a.encode() for a in argv], dtype=np.object_)),
            pb_utils.Tensor("PASSED", np.array([passed], dtype=np.bool_)),
        ]) for _ in requests]
