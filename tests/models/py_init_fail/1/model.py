class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("no weights in " + args["model_repository"])

    def execute(self, requests):
        return []
