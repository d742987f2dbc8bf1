"""A Python-based stand-in for Triton's `dyna_sequence` C++ test backend
(server/src/test/dyna_sequence), which Triton's qa image builds and L0_http / L0_grpc serve as
`simple_string_dyna_sequence`. The harness puts it at `<backend dir>/dyna_sequence/model.py`,
where Triton (and nursery) look for a Python-based backend named `dyna_sequence`.

Behaviour, as that backend documents it: one INT32 accumulator per sequence, driven by the
sequence batcher's START, END, READY and CORRID control inputs. READY=0 leaves it alone; START=1
sets it to the sum of INPUT's elements, START=0 adds that sum; END=1 adds the correlation ID (a
string ID is read as a number); with READY=1 the accumulator fills every element of OUTPUT.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.accumulators = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            ready, start, end = (int(_scalar(request, n)) for n in ("READY", "START", "END"))
            corrid = _scalar(request, "CORRID")
            if isinstance(corrid, (bytes, np.bytes_)):
                corrid = corrid.decode()
            key = str(corrid)
            if ready:
                total = int(values.astype(np.int64).sum())
                value = total if start else self.accumulators.get(key, 0) + total
                if end:
                    value += int(corrid)
                    self.accumulators.pop(key, None)
                else:
                    self.accumulators[key] = value
            else:
                value = self.accumulators.get(key, 0)
            output = np.full(values.shape, value, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses
