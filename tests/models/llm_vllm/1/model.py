import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


class TritonPythonModel:
    """A deterministic stand-in for a vLLM-backend model (decoupled): the sampling fields
    arrive as the JSON string ``sampling_parameters``. It "generates" the prompt's words in
    reverse order, one word per token, honouring ``max_tokens`` and ``stop`` from the sampling
    parameters; with ``logprobs`` asked it adds vLLM's ``logprobs`` output (each token rank 1
    with log probability -0.5, a runner-up "x" at -2.0). ``__params__`` answers with the JSON
    of the sampling parameters and the request parameters."""

    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            prompt = _scalar(request, "text_input", "")
            stream = bool(_scalar(request, "stream", False))
            sampling = json.loads(_scalar(request, "sampling_parameters", "{}"))
            if prompt == "__params__":
                seen = {"sampling": sampling, "parameters": json.loads(request.parameters()),
                        "exclude_input_in_output": _scalar(request, "exclude_input_in_output")}
                sender.send(self.respond(json.dumps(seen, sort_keys=True), 1, 1, None),
                            flags=final)
                continue
            words = list(reversed(prompt.split()))
            out = []
            for word in words:
                if word in sampling.get("stop", []) or len(out) >= sampling.get("max_tokens", 16):
                    break
                out.append(word)
            logprobs = sampling.get("logprobs")
            if not stream:
                sender.send(self.respond(" ".join(out), len(words), len(out),
                                         out if logprobs else None), flags=final)
                continue
            for i, word in enumerate(out):
                text = word if i == 0 else " " + word
                sender.send(self.respond(text, len(words), 1, [text] if logprobs else None))
            sender.send(flags=final)
        return None

    def respond(self, text, n_in, n_out, tokens):
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([n_in], dtype=np.uint32)),
            pb_utils.Tensor("num_output_tokens", np.array([n_out], dtype=np.uint32)),
        ]
        if tokens is not None:
            data = [{"7": {"logprob": -0.5, "rank": 1, "decoded_token": t},
                     "8": {"logprob": -2.0, "rank": 2, "decoded_token": "x"}} for t in tokens]
            tensors.append(pb_utils.Tensor(
                "logprobs", np.array([json.dumps(data).encode()], dtype=np.object_)))
        return pb_utils.InferenceResponse(output_tensors=tensors)
