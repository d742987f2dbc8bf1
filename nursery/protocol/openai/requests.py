"""An OpenAI request's fields and errors, pure: typed reads of the JSON body (each wrong one
a 400 naming its field, in OpenAI's words), the chat messages made ready for a template, and
:class:`ApiError`, the answer in OpenAI's ``{"error": {"message", "type", "param", "code"}}``
shape. A model's or the core's error keeps the status the KServe port gives it
(:func:`from_nursery`)."""

from __future__ import annotations

import json
from typing import Any

from nursery.errors import ErrorKind, NurseryError
from nursery.protocol.codecs.status import HTTP_STATUS
from nursery.protocol.http.infer import Response

_JSON = [(b"content-type", b"application/json")]


class ApiError(Exception):
    """An answer in OpenAI's error shape, with the message also under ``detail``, where
    Triton's frontend puts it (FastAPI's ``HTTPException``), so clients written for either
    read it; ``detail=False`` for the answers Triton's frontend gives in OpenAI's shape alone
    (a body past the size limit)."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, detail: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.detail = detail

    @property
    def body(self) -> bytes:
        kind = "invalid_request_error" if self.status < 500 else "internal_server_error"
        answer: dict[str, Any] = {"error": {"message": self.message, "type": kind,
                                            "param": self.param, "code": self.code}}
        if self.detail:
            answer["detail"] = self.message
        return dumps(answer)

    def response(self) -> Response:
        return self.status, list(_JSON), self.body


def from_nursery(error: NurseryError) -> ApiError:
    """A model's (or the core's) error with the status the KServe port gives it."""
    status = HTTP_STATUS[error.kind]
    code = {ErrorKind.NOT_FOUND: "not_found", ErrorKind.UNAVAILABLE: "unavailable",
            ErrorKind.CANCELLED: "cancelled"}.get(error.kind)
    return ApiError(status, error.message, code)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()



_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string",
               list: "an array", dict: "an object"}


def _got(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in _TYPE_NAMES.items():
        if type(value) is kind:
            return name
    return type(value).__name__


class Fields:
    """Typed reads of a request body, each wrong one a 400 naming its field."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def bad(self, key: str, expected: str, value: Any) -> ApiError:
        return ApiError(400, f"Invalid type for '{key}': expected {expected}, but got "
                        f"{_got(value)} instead.", "invalid_type", key)

    def present(self, key: str) -> bool:
        return self.body.get(key) is not None

    def boolean(self, key: str, default: bool | None = None) -> bool | None:
        value = self.body.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, "a boolean", value)
        return value

    def integer(self, key: str, low: int | None = None, high: int | None = None) -> int | None:
        value = self.body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(key, "an integer", value)
        if low is not None and value < low:
            raise ApiError(400, f"Invalid '{key}': integer below minimum value. Expected a "
                           f"value >= {low}, but got {value} instead.",
                           "integer_below_min_value", key)
        if high is not None and value > high:
            raise ApiError(400, f"Invalid '{key}': integer above maximum value. Expected a "
                           f"value <= {high}, but got {value} instead.",
                           "integer_above_max_value", key)
        return value

    def number(self, key: str, low: float, high: float) -> float | None:
        value = self.body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.bad(key, "a decimal", value)
        if not low <= value <= high:
            raise ApiError(400, f"Invalid '{key}': expected a value between {low:g} and "
                           f"{high:g}, but got {value} instead.", "invalid_value", key)
        return float(value)

    def string(self, key: str, required: bool = False) -> str | None:
        value = self.body.get(key)
        if value is None:
            if required:
                raise ApiError(400, f"Missing required parameter: '{key}'.",
                               "missing_required_parameter", key)
            return None
        if not isinstance(value, str):
            raise self.bad(key, "a string", value)
        return value

    def stop(self) -> list[str]:
        value = self.body.get("stop")
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            if len(value) > 4:
                raise ApiError(400, "Invalid 'stop': array too long. Expected an array with "
                               f"maximum length 4, but got an array with length {len(value)} "
                               "instead.", "array_above_max_length", "stop")
            return list(value)
        raise self.bad("stop", "a string or an array of strings", value)

    def include_usage(self, stream: bool) -> bool:
        options = self.body.get("stream_options")
        if options is None:
            return False
        if not isinstance(options, dict):
            raise self.bad("stream_options", "an object", options)
        if not stream:
            raise ApiError(400, "`stream_options` can only be used when `stream` is True",
                           None, "stream_options")
        return bool(Fields(options).boolean("include_usage", False))


def conversation(messages: Any) -> list[dict[str, Any]]:
    """The chat messages for the template: each content made one string (text parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "Invalid 'messages': expected a non-empty array of messages.",
                       "invalid_value", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"Invalid 'messages[{i}]': each message needs a 'role' string.",
                           "invalid_value", f"messages[{i}]")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ApiError(400, f"Invalid 'messages[{i}].content': only text parts are "
                                   "supported.", "invalid_value", f"messages[{i}].content")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is not None and not isinstance(content, str):
            raise ApiError(400, f"Invalid type for 'messages[{i}].content': expected a string "
                           f"or an array of text parts, but got {_got(content)} instead.",
                           "invalid_type", f"messages[{i}].content")
        out.append({**message, "content": content if content is not None else ""})
    return out


__all__ = ["ApiError", "Fields", "conversation", "dumps", "from_nursery"]
