"""Model repositories in object stores: S3, GCS and Azure Blob Storage.

``url`` reads a repository URL, ``credentials`` picks a root's credential, one module per
cloud (``s3``, ``gcs``, ``azure``) lists and downloads through that cloud's own SDK (each an
optional extra, imported only when a root of its scheme is read), and ``mirror`` turns a
listed model folder into a complete local one through a cache keyed by each object's tag.
Everything here blocks: callers run it off the trio thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from nursery.config.storage.azure import AzureStore
from nursery.config.storage.base import ObjectStore, StorageError
from nursery.config.storage.gcs import GcsStore
from nursery.config.storage.s3 import S3Store
from nursery.config.storage.url import CloudRoot

_stores: dict[str, ObjectStore] = {}
_lock = threading.Lock()


def open_store(root: CloudRoot) -> ObjectStore:
    """The store of ``root`` (made once per URL and kept: clients are thread-safe and keep
    their connections). Raises :class:`StorageError` for a malformed URL, a missing extra or
    a credential that cannot be used."""
    if root.error:
        raise StorageError(root.error)
    with _lock:
        store = _stores.get(root.url)
        if store is None:
            kinds: dict[str, Callable[[CloudRoot], ObjectStore]] = {
                "s3": S3Store, "gs": GcsStore, "as": AzureStore}
            store = _stores[root.url] = kinds[root.scheme](root)
        return store


def forget_stores() -> None:
    """Drop the clients made so far (a test that changes credentials starts afresh)."""
    with _lock:
        _stores.clear()
