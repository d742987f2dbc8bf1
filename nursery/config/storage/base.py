"""What every object store gives the repository: a listing and a download, both blocking.

A store lists the objects under a repository root with the metadata that says whether one
changed (the ETag of S3 and Azure, the generation of GCS) and downloads one object to a local
file, refusing an object that changed since it was listed. Its library's errors come out as
:class:`StorageError` with the cause in words; the caller names the URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nursery.config.storage.url import CloudRoot

# how long one request may wait for the storage server (connect, then each read): a server
# that stops answering fails the load or poll that asked, never the server
DEFAULT_TIMEOUT = 30.0


def timeout() -> float:
    """``NURSERY_STORAGE_TIMEOUT_SECS`` or the default."""
    try:
        value = float(os.environ.get("NURSERY_STORAGE_TIMEOUT_SECS", DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


class StorageError(Exception):
    """A store could not list or download: the message says why, in words."""


def missing_extra(scheme: str, module: str, extra: str) -> StorageError:
    return StorageError(f"{scheme}:// repositories need the '{extra}' extra "
                        f"(pip install 'nursery[{extra}]'): {module} is not installed")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object under a repository root: its key relative to the root, size and tag."""

    rel: str
    size: int
    tag: str  # ETag (S3, Azure) or generation (GCS): changes whenever the content does


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """A model folder in a bucket: the root it is in and its objects (``rel`` relative to
    the model folder), as listed; no byte of it downloaded yet."""

    root: CloudRoot
    name: str
    files: tuple[ObjectInfo, ...]


class ObjectStore(Protocol):
    def list(self) -> list[ObjectInfo]:
        """Every object under the root (folder markers included, ending in '/')."""
        ...

    def download(self, obj: ObjectInfo, dest: Path) -> None:
        """Write ``obj`` (``rel`` relative to the root) to ``dest``; fail if it is gone or
        its tag is no longer ``obj.tag``."""
        ...


def unsafe_part(rel: str) -> bool:
    """Whether an object key, relative to its model folder, would climb out of it or is not
    a plain relative path (``..``, ``.``, an empty component: an absolute key)."""
    parts = rel.split("/")
    if rel.endswith("/"):
        parts = parts[:-1]
    return not rel or "\0" in rel or "\\" in rel or any(p in ("", ".", "..") for p in parts)
