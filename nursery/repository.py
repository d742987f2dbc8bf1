"""Pure functions over model repositories: find models, their versions, the version policy.

Layout (Triton's): ``<repo>/<model>/config.pbtxt`` and numbered version folders
``<repo>/<model>/<n>/`` holding the model file (``model.onnx`` and so on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import betterproto

from nursery.errors import ConfigError
from nursery.protocol._generated import inference as pb


@dataclass(frozen=True, slots=True)
class ModelLocation:
    name: str
    path: Path  # the model's folder
    repository: Path  # the repository root it was found in


@dataclass(frozen=True, slots=True)
class RepositoryScan:
    models: dict[str, ModelLocation]
    # models found in more than one repository: Triton refuses to load either copy
    duplicates: dict[str, tuple[Path, ...]]


def scan(repositories: tuple[Path, ...] | list[Path]) -> RepositoryScan:
    """Every model folder in the given repositories (hidden folders skipped)."""
    found: dict[str, list[ModelLocation]] = {}
    for repo in repositories:
        try:
            entries = sorted(os.scandir(repo), key=lambda e: e.name)
        except OSError as exc:
            raise ConfigError(f"failed to read model repository '{repo}': {exc.strerror}") from exc
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            found.setdefault(entry.name, []).append(
                ModelLocation(entry.name, Path(entry.path), Path(repo))
            )
    models = {name: locs[0] for name, locs in found.items() if len(locs) == 1}
    duplicates = {
        name: tuple(loc.repository for loc in locs) for name, locs in found.items() if len(locs) > 1
    }
    return RepositoryScan(models, duplicates)


def available_versions(model_path: Path) -> list[int]:
    """Numbered version folders of a model, ascending (non-numeric folders are ignored)."""
    versions = []
    try:
        entries = list(os.scandir(model_path))
    except OSError:
        return []
    for entry in entries:
        if entry.is_dir() and entry.name.isdigit() and not entry.name.startswith("0"):
            versions.append(int(entry.name))
        elif entry.is_dir() and entry.name == "0":
            versions.append(0)
    return sorted(versions)


def select_versions(policy: pb.ModelVersionPolicy, available: list[int]) -> list[int]:
    """Apply a version policy (``latest``, ``all`` or ``specific``) to the versions on disk."""
    which, value = betterproto.which_one_of(policy, "policy_choice")
    if which == "all":
        return sorted(available)
    if which == "specific":
        wanted = set(value.versions)
        return sorted(v for v in available if v in wanted)
    num = value.num_versions if which == "latest" else 1
    return sorted(available)[-max(num, 1) :] if available else []
