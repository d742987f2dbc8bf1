import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BYTES identity whose configuration comes from auto_complete_config."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]})
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        self.instance = args["model_instance_name"]
        pb_utils.Logger.log_info(f"py_string_identity: {self.instance} ready")

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", in_0.as_numpy())]))
        return responses
