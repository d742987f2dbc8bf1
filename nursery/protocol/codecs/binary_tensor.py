"""The binary tensor data extension: a JSON header followed by raw tensor blocks.

``Inference-Header-Content-Length`` gives the JSON header's byte length; each input (request)
or output (response) carrying ``parameters.binary_data_size`` owns the next block, in order.
Pure functions: no I/O, no trio.
"""

from __future__ import annotations

import re

from nursery.errors import InvalidArgument

HEADER = "Inference-Header-Content-Length"
HEADER_LOWER = b"inference-header-content-length"
_STOI = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT32_MAX = 2**31 - 1


def header_size_in_type(content_type: bytes | None, content_length: int,
                        mime: bytes) -> int | None:
    """The JSON header's size declared by a content type of the form ``<mime><size>`` (the
    SageMaker and Vertex AI frontends' ``...binary+json;json-header-size=``); None when the
    content type is not that one (the whole body is JSON). Refusals in Triton's words
    (``GetInferenceHeaderLength``): the type must start the header value, the size is read
    as C++'s ``stoi`` reads it (leading blanks, a sign, digits; what follows is ignored) and
    must lie in [0, content length]."""
    if content_type is None:
        return None
    pos = content_type.find(mime)
    if pos < 0:
        return None
    if pos != 0:
        raise InvalidArgument(f"expect MIME type for binary data starts with "
                              f"'{mime.decode()}', got: {content_type.decode('latin-1')}")
    rest = content_type[len(mime):]
    text = rest.decode("latin-1")
    digits = _STOI.match(rest)
    if digits is None:
        raise InvalidArgument(f"Unable to parse inference header size, got: {text}")
    number = digits.group(1)
    # past 20 digits it is out of range, without int()'s cost (or its refusal past 4300)
    value = int(number) if len(number) <= 20 else _INT32_MAX + 1
    if not -_INT32_MAX - 1 <= value <= _INT32_MAX:
        raise InvalidArgument(
            f"Unable to parse inference header size, value is out of range, got: {text}")
    if value < 0 or value > content_length:
        raise InvalidArgument(f"inference header size should be in range (0, "
                              f"{content_length}), got: {text}")
    return value


def split_body(body: bytes, header_value: bytes | None) -> tuple[memoryview, memoryview | None]:
    """Split a request body into the JSON header and the binary section.

    Returns ``(json, binary)``; ``binary`` is None without the header (all JSON).
    A header length of 0 means a raw binary request (no JSON at all): ``json`` is empty.
    """
    view = memoryview(body)
    if header_value is None:
        return view, None
    text = header_value.decode("latin-1").strip()
    shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()):  # int() would also take "1_0" and " 1"
        raise InvalidArgument(f"Unable to parse {HEADER}, got: {shown}")
    # thousands of digits: out of range, without int()'s quadratic conversion (or its
    # ValueError past 4300 digits)
    length = int(text) if len(digits) <= 20 else -1
    if length < 0 or length > len(body):
        raise InvalidArgument(
            f"inference header size should be in range (0, {len(body)}), got: {shown}"
        )
    return view[:length], view[length:]


class BlockReader:
    """Hands out consecutive blocks of the binary section to binary inputs, in order."""

    __slots__ = ("_data", "_pos", "_model")

    def __init__(self, data: memoryview | None, model: str) -> None:
        self._data = data
        self._pos = 0
        self._model = model

    def take(self, name: str, size: int) -> memoryview:
        data = self._data
        if data is None:
            raise InvalidArgument(
                f"unexpected size for input '{name}', expecting {size} additional bytes for "
                f"model '{self._model}'"
            )
        end = self._pos + size
        if end > len(data):
            raise InvalidArgument(
                f"unexpected size for input '{name}', expecting {end - len(data)} additional "
                f"bytes for model '{self._model}'"
            )
        block = data[self._pos : end]
        self._pos = end
        return block

    def finish(self) -> None:
        if self._data is not None and self._pos != len(self._data):
            raise InvalidArgument(f"unexpected additional input data for model '{self._model}'")
