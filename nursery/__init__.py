"""nursery: an inference server that speaks Triton's protocols, as an actor system on trio."""

from __future__ import annotations

from typing import Any

from nursery.errors import ErrorKind as ErrorKind  # noqa: E402
from nursery.errors import NurseryError as NurseryError  # noqa: E402
from nursery.runtime.about import VERSION as __version__  # noqa: E402, F401

# the in-process API, imported on first use so that `import nursery` stays light
_EMBED = ("Server", "Tensor", "DynamicBatcher", "DynamicBatching", "QueuePolicy")


def __getattr__(name: str) -> Any:
    if name in _EMBED:
        from nursery import embed

        return getattr(embed, name)
    raise AttributeError(f"module 'nursery' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EMBED])
