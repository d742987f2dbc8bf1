"""tiny_llm: a small random-weight decoder served with continuous batching and
multi-LoRA by nursery.llm (docs/llm.md). Made by scripts/make_llm.py."""

import triton_python_backend_utils as pb_utils

from nursery.llm.serving import DecoderServer


class TritonPythonModel:
    def initialize(self, args):
        self.server = DecoderServer(args, pb_utils)

    def execute(self, requests):
        for request in requests:
            self.server.submit(request)  # answered from the decode loop's thread
        return None

    def finalize(self):
        self.server.close()
