"""The arrival log (nursery only: ``--arrival-log FILE``): one JSON line per accepted request.

Written by ``Core`` as each validated request joins its model's scheduler, so that production
traffic can be replayed in the simulator (``python -m nursery simulate --arrivals trace
--trace FILE``). A line holds ``time`` (seconds since the log opened, monotonic clock),
``model``, ``version``, ``batch_size`` (rows), ``priority``, ``timeout_us``, and the sequence
fields ``sequence_id``, ``sequence_start`` and ``sequence_end`` (0/false for requests outside a
sequence). Lines are buffered and written when the buffer fills and when the server stops;
nothing is recorded, and nothing costs, when the flag is not given.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO


class ArrivalLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = self.path.open("w", buffering=1 << 16)
        self._t0 = time.monotonic_ns()

    def record(self, model: str, version: int | str, work: Any) -> None:
        if self._file is None:
            return
        request = work.request
        line = {
            "time": (work.enqueued_ns - self._t0) / 1e9,
            "model": model,
            "version": str(version),
            "batch_size": work.batch_size,
            "priority": work.priority,
            "timeout_us": work.timeout_us,
            "sequence_id": getattr(request, "sequence_id", 0) or 0,
            "sequence_start": bool(getattr(request, "sequence_start", False)),
            "sequence_end": bool(getattr(request, "sequence_end", False)),
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
