"""``request.get_response_sender()``: how a Python model answers its requests.

The rules are Triton's (python_backend's ``ResponseSender``), with its messages:

- ``flags`` is 0 or ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; with 0 a response is required;
- a model that is not decoupled sends one response, then (or with it) the final flag; a second
  response, or the final flag before any response, raises;
- after the final flag every send raises ("Response sender has been closed").

A response of a model that is not decoupled goes to the requester when it is sent (the final
flag that follows only closes the sender). Where Triton would leave a request unanswered (a
model that is not decoupled sends the final flag without a response after ``execute``
returned), the request gets that error instead, so neither the client nor an unload waits
for ever.
"""

from __future__ import annotations

import threading
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

    def convert(self, response: Any, request: InferenceRequest, sent: bool = False
                ) -> InferenceResponse | NurseryError: ...


class ResponseSender:
    """``request.get_response_sender()``: usable from any thread."""

    def __init__(self, deliver: Callable[[Any], None], request: InferenceRequest,
                 instance: Answers, cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._request = request
        self._instance = instance
        self._cancelled = cancelled
        self._lock = threading.Lock()
        self.sent = 0  # sends so far (the final flag alone counts, as in Triton)
        self.closed = False  # the final flag was sent (or the request was answered otherwise)
        self.taken = False  # the model asked for this sender (it may answer after execute)
        self.returned = False  # execute has returned: an exception here fails no batch

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, _FINAL):
            raise pb_utils.TritonModelException(
                "Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise pb_utils.TritonModelException(
                "Inference Response object must be provided when the response flags is set "
                "to zero.")
        final = flags == _FINAL
        decoupled = self._instance.decoupled
        with self._lock:
            if not decoupled:
                if response is not None and self.sent > 0:
                    raise pb_utils.TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than "
                        "one response.")
                if response is None and final and self.sent == 0:
                    message = ("Unable to send response. Non-decoupled model cannot send "
                               "complete final before sending a response.")
                    if self.returned and not self.closed:  # nobody else will answer it
                        self.closed = True
                        self._deliver(InternalError(message))
                    raise pb_utils.TritonModelException(message)
            if self.closed:
                raise pb_utils.TritonModelException(
                    "Unable to send response. Response sender has been closed.")
            if final:
                self.closed = True
            self.sent += 1
        if response is None:
            if decoupled:
                self._deliver(Part(None, None, True))
            return  # not decoupled: its one response went when it was sent
        answer = self._instance.convert(response, self._request, sent=True)
        if not decoupled:
            self._deliver(answer)
        elif isinstance(answer, NurseryError):
            self._deliver(Part(None, answer, final))
        else:
            self._deliver(Part(answer, None, final))

    def fail(self, error: NurseryError) -> Any:
        """Close the sender for a failed ``execute``: the error the request still needs
        (as an answer of the call), or None where the model answered already."""
        with self._lock:
            answered = self.closed or (not self._instance.decoupled and self.sent > 0)
            self.closed = True
        return None if answered else error

    def claim(self) -> bool:
        """Close the sender for a response ``execute`` returned: False where the sender
        answered already (Triton then fails the call, see the backend)."""
        with self._lock:
            if self.closed or self.sent > 0:
                return False
            self.closed = True
            self.sent += 1
            return True

    def is_cancelled(self) -> bool:
        return self._cancelled()
