"""Custom metrics from model.py, as Triton's Python backend offers them: a counter of requests,
a gauge of the last input, a histogram of inputs. An input of -1 tries to set the counter,
which Triton refuses: the refusal's message comes back as the request's error."""


import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # the families are kept as long as their metrics: as in Triton, a metric whose
        # MetricFamily object is deleted refuses every operation
        self.families = [
            pb_utils.MetricFamily(name="py_metrics_requests",
                                  description="Requests the model served",
                                  kind=pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(name="py_metrics_last_input",
                                  description="The last input seen",
                                  kind=pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily(name="py_metrics_inputs", description="Inputs seen",
                                  kind=pb_utils.MetricFamily.HISTOGRAM)]
        self.requests = self.families[0].Metric(labels=labels)
        self.last = self.families[1].Metric(labels=labels)
        self.inputs = self.families[2].Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if value == -1:
                try:
                    self.requests.set(5)
                except pb_utils.TritonModelException as exc:
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(str(exc))))
                    continue
            self.requests.increment(1)
            self.last.set(value)
            self.inputs.observe(value)
            total = self.requests.value()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.array([total], dtype=np.float32))]))
        return responses
