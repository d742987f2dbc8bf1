"""The in-process API: the whole server inside another program (``nursery.Server``), and
Python functions served as models (``Server.bind`` with :class:`Tensor` and
:class:`DynamicBatcher`). See docs/embedding.md."""

from __future__ import annotations

from nursery.embed.binding import DynamicBatcher, DynamicBatching, QueuePolicy, Tensor
from nursery.embed.server import Server

__all__ = ["DynamicBatcher", "DynamicBatching", "QueuePolicy", "Server", "Tensor"]
