"""nursery: an inference server that speaks Triton's protocols, as an actor system on trio."""

from __future__ import annotations

__version__ = "0.1.0"

from nursery.errors import ErrorKind as ErrorKind  # noqa: E402
from nursery.errors import NurseryError as NurseryError  # noqa: E402
