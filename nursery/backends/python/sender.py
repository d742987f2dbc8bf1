"""``request.get_response_sender()``: how a Python model answers its requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from nursery.backends.python import pb_utils
from nursery.errors import InternalError, NurseryError
from nursery.messages import Part
from nursery.types import InferenceRequest, InferenceResponse

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Answers(Protocol):
    """What a sender needs of its model instance."""

    decoupled: bool
    model_name: str

    def convert(self, response: Any, request: InferenceRequest
                ) -> InferenceResponse | NurseryError: ...


class ResponseSender:
    """``request.get_response_sender()``: usable from any thread; each response goes to the
    requester at once (decoupled), or the one final response (not decoupled)."""

    def __init__(self, deliver: Callable[[Any], None], request: InferenceRequest,
                 instance: Answers, cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._request = request
        self._instance = instance
        self._cancelled = cancelled
        self._held: Any = None
        self.closed = False

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        if self.closed:
            raise pb_utils.TritonModelException(
                "Unable to send response. Response sender has been closed.")
        final = bool(flags & _FINAL)
        if response is None and not final:
            raise pb_utils.TritonModelException(
                "Inference Response object must be provided when the response flags is not "
                "equal to TRITONSERVER_RESPONSE_COMPLETE_FINAL.")
        answer = None if response is None else self._instance.convert(response, self._request)
        if final:
            self.closed = True
        if self._instance.decoupled:
            if isinstance(answer, NurseryError):
                self._deliver(Part(None, answer, final))
            else:
                self._deliver(Part(answer, None, final))
            return
        if answer is not None:
            if self._held is not None:
                raise pb_utils.TritonModelException(
                    "Non-decoupled model cannot send more than one response.")
            self._held = answer
        if final:
            self._deliver(self._held if self._held is not None else InternalError(
                f"model '{self._instance.model_name}' sent the final flag without a response"))

    def is_cancelled(self) -> bool:
        return self._cancelled()
