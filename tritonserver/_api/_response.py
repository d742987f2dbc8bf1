"""``tritonserver._api._response``: where Triton's package keeps ``InferenceResponse`` (its
OpenAI frontend names the class by this path in its annotations)."""

from tritonserver._api import InferenceResponse

__all__ = ["InferenceResponse"]
