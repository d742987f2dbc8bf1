"""The garbage collector's view of the heap: the start-up heap frozen out of its sight.

A busy server triggers a full collection every few tens of thousands of allocations; frozen
objects (``gc.freeze``) are not walked by it, so the start-up heap (modules, backends, the
models loaded at start) costs those collections nothing. Measured (bench/python_backend.py,
ens_onnx2 at concurrency 16): p99 from 33 to 12 ms, throughput +12%.

Frozen objects are never collected either: cyclic garbage that is frozen stays for good. So
the heap is frozen once, at start-up, right after a collection (only what is alive is
frozen), and never again: freezing after every later load kept each load's garbage cycles
for good (bench/soak.py: +1.3 MB a minute under load/unload churn), and collecting before each
freeze instead stalled the trio thread ~20-50 ms at every load and unload (the soak's p99 went
from ~5 to ~45 ms under churn). Models loaded later are left to the collector; a version
loaded at start-up and unloaded later leaves its frozen cycles behind once.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect once, then freeze everything alive (once, when start-up loading is done)."""
    gc.collect()
    gc.freeze()


__all__ = ["settle_heap"]
