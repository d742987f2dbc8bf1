"""A model's versions: the numbered folders on disk, and those its version policy serves.

Apart from ``repository.py`` (which reads buckets too, and so imports the cloud storage code)
so that reading a model's configuration, as a Python stub process does at its start, does not
load the storage code.
"""

from __future__ import annotations

import os
from pathlib import Path

import betterproto

from nursery.schema import inference as pb


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
    which, _ = betterproto.which_one_of(policy, "policy_choice")
    if which == "all":
        return sorted(available)
    if which == "specific":
        wanted = set(policy.specific.versions)
        return sorted(v for v in available if v in wanted)
    num = policy.latest.num_versions if which == "latest" else 1
    return sorted(available)[-max(num, 1) :] if available else []
