"""A model's versions: the numbered folders on disk, and those its version policy serves.

Apart from ``repository.py`` (which reads buckets too, and so imports the cloud storage code)
so that reading a model's configuration, as a Python stub process does at its start, does not
load the storage code.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import betterproto

from nursery.schema import inference as pb

log = logging.getLogger("nursery.config")

# a model folder's folders that are not versions (Triton skips them without a word)
_NOT_VERSIONS = frozenset({"warmup", "initial_state", "configs", "__pycache__"})


def available_versions(model_path: Path, warn: bool = False) -> list[int]:
    """Numbered version folders of a model, ascending. Other folders are ignored, with
    Triton's warning when ``warn`` (a load): a number with leading zeros ("003"), or a name
    that is not a number."""
    versions = []
    try:
        entries = list(os.scandir(model_path))
    except OSError:
        return []
    for entry in sorted(entries, key=lambda e: e.name):
        if not entry.is_dir() or entry.name in _NOT_VERSIONS:
            continue
        if entry.name.isascii() and entry.name.isdigit():
            if len(entry.name) > 1 and entry.name.startswith("0"):
                if warn:
                    log.warning("ignore version directory '%s' which contains leading zeros "
                                "in its directory name", entry.name)
                continue
            versions.append(int(entry.name))
        elif warn:
            log.warning("ignore version directory '%s' which fails to convert to integral "
                        "number", entry.name)
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
