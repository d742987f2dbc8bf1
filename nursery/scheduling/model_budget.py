"""Which models to unload when the loaded ones exceed ``--model-load-budget`` (pure).

The budget counts models, bytes of model files, or both. Every loaded model is kept in
order of last use; when the budget is exceeded, the least recently used models are chosen
for unloading until what remains fits, skipping every model that is busy (requests in
flight), pinned (``--model-pin``) or the one just asked for. When only such models are left,
the budget stays exceeded until one of them becomes idle: a busy model is never unloaded.

No clock: recency is the order of :meth:`LruBudget.used` calls.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Budget:
    models: int | None = None  # at most this many models loaded
    bytes: int | None = None  # at most this many bytes of model files loaded

    def __bool__(self) -> bool:
        return self.models is not None or self.bytes is not None

    def fits(self, count: int, size: int) -> bool:
        return ((self.models is None or count <= self.models)
                and (self.bytes is None or size <= self.bytes))


_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def _size(text: str) -> int:
    digits = text.rstrip("bBkKmMgGtTiI")
    unit = text[len(digits):].lower().removesuffix("b")
    if not digits.isdigit() or unit not in _UNITS:
        raise ValueError(f"'{text}' is not a size (a number of bytes, or with k, M, G, Gi, ...)")
    return int(digits) * _UNITS[unit]


def parse_budget(entries: Iterable[str]) -> Budget:
    """``--model-load-budget`` values: ``models=<n>``, ``bytes=<size>`` (``2G``, ``512Mi``),
    comma-separated or repeated. Raises ValueError with the reason."""
    models: int | None = None
    size: int | None = None
    for entry in entries:
        for part in entry.split(","):
            key, eq, value = part.strip().partition("=")
            if key == "models" and eq and value.isdigit() and int(value) > 0:
                models = int(value)
            elif key == "bytes" and eq:
                size = _size(value.strip())
                if size <= 0:
                    raise ValueError("bytes=<size> must be more than 0")
            else:
                raise ValueError(f"'{part}' is not models=<n> (n > 0) or bytes=<size>")
    return Budget(models, size)


class LruBudget:
    """The loaded models in order of last use, with their sizes, and the choice of what to
    unload."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.resident: OrderedDict[str, int] = OrderedDict()  # least recently used first

    def loaded(self, name: str, size: int) -> None:
        """``name`` is loaded (or reloaded) with ``size`` bytes of files; it counts as used."""
        self.resident[name] = size
        self.resident.move_to_end(name)

    def adopt(self, name: str, size: int) -> None:
        """A model found loaded that was never used here (loaded at start or by the API): it
        counts as the least recently used."""
        if name not in self.resident:
            self.resident[name] = size
            self.resident.move_to_end(name, last=False)

    def used(self, name: str) -> None:
        if name in self.resident:
            self.resident.move_to_end(name)

    def unloaded(self, name: str) -> None:
        self.resident.pop(name, None)

    def total(self) -> int:
        return sum(self.resident.values())

    def within(self) -> bool:
        return self.budget.fits(len(self.resident), self.total())

    def victims(self, busy: Iterable[str] = (), pinned: Iterable[str] = (),
                keep: str | None = None) -> list[str]:
        """The models to unload, least recently used first, so that the rest fit the budget;
        never a busy or pinned one, nor ``keep``. Fewer (or none) when only those would
        help."""
        spared = {*busy, *pinned}
        if keep is not None:
            spared.add(keep)
        count, size = len(self.resident), self.total()
        out: list[str] = []
        for name, bytes_ in self.resident.items():
            if self.budget.fits(count, size):
                break
            if name in spared:
                continue
            out.append(name)
            count -= 1
            size -= bytes_
        return out
