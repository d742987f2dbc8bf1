"""Which credential a cloud root uses, as Triton chooses it.

Without ``TRITON_CLOUD_CREDENTIAL_PATH`` each store reads its SDK's environment variables
(``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_*``). With it, the JSON file
it names holds one table per scheme (``"s3"``, ``"gs"``, ``"as"``) from a URL prefix to a
credential, and a root uses the entry with the longest prefix of its URL; a root that no
entry matches cannot be read ("Cannot match credential"):

    {"s3": {"s3://bucket-a": {"key_id": "...", "secret_key": "...", "region": "...",
                              "session_token": "...", "profile": "..."}},
     "gs": {"gs://bucket-b": "/path/to/service-account.json"},
     "as": {"as://account/container": {"account_str": "...", "account_key": "..."}}}
"""

from __future__ import annotations

import json
import os
from typing import Any

from nursery.config.storage.base import StorageError
from nursery.config.storage.url import CloudRoot

ENV = "TRITON_CLOUD_CREDENTIAL_PATH"


def from_file(root: CloudRoot) -> Any | None:
    """The credential the file assigns to ``root`` (a dict for s3/as, a path for gs), or
    None without a credential file. Raises :class:`StorageError` for a file that cannot be
    read or that has no entry for the root."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot read the credential file {ENV}={path}: {exc}") from None
    entries = table.get(root.scheme) if isinstance(table, dict) else None
    if not isinstance(entries, dict):
        entries = {}
    best = longest_prefix(entries, root.url)
    if best is None:
        raise StorageError(f"Cannot match credential for path {root.url} in {path}")
    value = entries[best]
    if root.scheme == "gs":
        if not isinstance(value, str):
            raise StorageError(f"credential '{best}' in {path} must be a file path")
    elif not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise StorageError(f"credential '{best}' in {path} must be an object of strings")
    return value


def longest_prefix(names: Any, url: str) -> str | None:
    """The longest of ``names`` that ``url`` starts with ("" matches every URL)."""
    matching = [n for n in names if isinstance(n, str) and url.startswith(n)]
    return max(matching, key=len) if matching else None
