import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _vector(text, dims):
    """4 numbers from a text (its length, its word count, its vowels, 1.0), cut to dims."""
    vector = [float(len(text)), float(len(text.split())),
              float(sum(c in "aeiou" for c in text)), 1.0]
    return vector[:dims] if dims else vector


class TritonPythonModel:
    """Embeddings in the vLLM convention Triton's OpenAI frontend uses: the JSON string
    ``embedding_request`` ({"input": text or [texts], "pooling_params": {"dimensions": [d]}})
    answered with the vector(s) as a JSON string in ``text_output`` and the word count in
    ``num_input_tokens``."""

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "embedding_request").as_numpy()
            body = json.loads(raw.reshape(-1)[0].decode())
            dims = (body.get("pooling_params", {}).get("dimensions") or [None])[0]
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            vectors = [_vector(t, dims) for t in texts]
            value = vectors if isinstance(body["input"], list) else vectors[0]
            words = sum(len(t.split()) for t in texts)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([json.dumps(value).encode()],
                                                        dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([words], dtype=np.int32)),
            ]))
        return responses
