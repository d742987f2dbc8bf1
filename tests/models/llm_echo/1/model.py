import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)
    if value.size == 0:
        return default
    value = value[0]
    return value.decode() if isinstance(value, bytes) else value.item()


def _strings(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


class TritonPythonModel:
    """A deterministic stand-in for an LLM with TensorRT-LLM's tensor names (decoupled).

    It "generates" the prompt's words again, one word per token: with ``stream`` true one
    response per word (" word", the first without its space), otherwise one response with the
    whole text; at most ``max_tokens`` words (default 16); a word in ``stop_words`` ends the
    text before it. ``num_input_tokens`` is the prompt's word count, ``num_output_tokens`` the
    words in that response. ``exclude_input_in_output`` false puts the prompt first.

    Special prompts: one containing the word ``forever`` generates its words again and again
    (20 ms a token, ignoring max_tokens) until ``request.is_cancelled()``; ``__params__``
    answers with the JSON of what the request carried (the optional inputs and the
    ``lora_name`` parameter); ``__stats__`` answers with how many requests it saw cancelled;
    ``__fail__`` answers an error; ``__fail_late__`` one token, then an error.
    """

    def initialize(self, args):
        self.cancelled = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self.run(request, sender)
            except Exception as exc:  # a test model answers its own failures
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def respond(self, text, n_in, n_out):
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([n_in], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([n_out], dtype=np.int32)),
        ])

    def run(self, request, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        prompt = _scalar(request, "text_input", "")
        stream = bool(_scalar(request, "stream", False))
        max_tokens = int(_scalar(request, "max_tokens", 16))
        stop = set(_strings(request, "stop_words"))
        words = prompt.split()
        if prompt == "__params__":
            seen = {name: _scalar(request, name) for name in (
                "stream", "max_tokens", "temperature", "top_p", "seed",
                "exclude_input_in_output", "return_num_input_tokens")}
            seen["stop_words"] = _strings(request, "stop_words")
            seen["parameters"] = json.loads(request.parameters())
            if isinstance(seen.get("temperature"), float):
                seen["temperature"] = round(seen["temperature"], 4)
            if isinstance(seen.get("top_p"), float):
                seen["top_p"] = round(seen["top_p"], 4)
            sender.send(self.respond(json.dumps(seen, sort_keys=True), 1, 1), flags=final)
            return
        if prompt == "__stats__":
            with self.lock:
                text = json.dumps({"cancelled": self.cancelled})
            sender.send(self.respond(text, 1, 1), flags=final)
            return
        if prompt == "__fail__":
            raise ValueError("the model was asked to fail")
        if prompt == "__fail_late__":
            sender.send(self.respond("one", 1, 1))
            raise ValueError("the model failed after its first token")
        if "forever" in words:
            i = 0
            while not request.is_cancelled():
                word = words[i % len(words)]
                sender.send(self.respond(word if i == 0 else " " + word, len(words), 1))
                i += 1
                time.sleep(0.02)
            with self.lock:
                self.cancelled += 1
            sender.send(flags=final)
            return
        out = []
        for word in words:
            if word in stop or len(out) >= max_tokens:
                break
            out.append(word)
        if _scalar(request, "exclude_input_in_output", True) is False:
            out = words + out
        if not stream:
            sender.send(self.respond(" ".join(out), len(words), len(out)), flags=final)
            return
        for i, word in enumerate(out):
            sender.send(self.respond(word if i == 0 else " " + word, len(words), 1))
        sender.send(flags=final)
