"""Model namespaces (Triton's ``--model-namespacing=true``): pure rules, no I/O.

With namespacing on, each repository is a namespace of its own (its path, as given), so two
repositories may hold models of the same name: both load, each known by its identifier
(namespace and name). A request names a model only, never a namespace (Triton exposes none),
so a name held by one loaded model reaches it, and a name held by several is refused as
ambiguous. An ensemble's step prefers the model of the ensemble's own namespace, and takes the
one model of that name elsewhere when its own namespace has none (Triton's dependency graph:
``FindNode`` with fuzzy matching). Without namespacing every identifier has the empty
namespace and is the model's name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from nursery.errors import InvalidArgument


@dataclass(frozen=True, slots=True, order=True)
class ModelId:
    """A model's identifier: Triton's ModelIdentifier (ordered by namespace, then name)."""

    namespace: str
    name: str

    @property
    def key(self) -> str:
        """How the identifier is written: the name alone without a namespace, else
        ``<namespace>::<name>`` (Triton's ``ModelIdentifier::str``)."""
        return f"{self.namespace}::{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return self.key


def find_identifier(name: str, known: Collection[ModelId],
                    preferred: str | None = None) -> ModelId:
    """The model ``name`` means among ``known`` (the identifiers of that name the server
    knows). ``preferred``: a namespace to try first (an ensemble step's: its ensemble's);
    otherwise, as in Triton's FindModelIdentifier, the name must be held by exactly one
    identifier: none is an unknown model, several are ambiguous (both INVALID_ARG, in
    Triton's words)."""
    if preferred is not None:
        wanted = ModelId(preferred, name)
        if wanted in known:
            return wanted
    if len(known) == 1:
        return next(iter(known))
    if not known:
        raise InvalidArgument(f"Request for unknown model: '{name}' is not found")
    raise InvalidArgument(
        f"There are {len(known)} identifiers of model '{name}' in global map, model namespace "
        "must be provided to resolve ambiguity.")


def step_model(name: str, namespace: str, candidates: Iterable[str]) -> str | None:
    """The namespace an ensemble of ``namespace`` takes its step model ``name`` from, given
    the namespaces that hold a model of that name (``candidates``): its own when it holds
    one, else the only one, else None (not available, or ambiguous)."""
    found = set(candidates)
    if namespace in found:
        return namespace
    if len(found) == 1:
        return next(iter(found))
    return None


def by_name(ids: Iterable[ModelId]) -> dict[str, tuple[ModelId, ...]]:
    """Triton's global map: each name and the identifiers that hold it (sorted)."""
    out: dict[str, list[ModelId]] = {}
    for mid in ids:
        out.setdefault(mid.name, []).append(mid)
    return {name: tuple(sorted(found)) for name, found in out.items()}
