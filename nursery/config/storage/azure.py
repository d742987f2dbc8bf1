"""Azure Blob Storage through azure-storage-blob, the ``azure`` extra.

``as://account/container/path``. Credentials as Triton takes them: ``AZURE_STORAGE_ACCOUNT``
(overrides the URL's account) with ``AZURE_STORAGE_KEY``, or the ``TRITON_CLOUD_CREDENTIAL_PATH``
entry (``account_str``, ``account_key``); without a key, anonymous access. Beyond Triton,
``AZURE_STORAGE_CONNECTION_STRING`` (its ``BlobEndpoint`` reaches Azurite or a sovereign
cloud) is used when set and no credential file entry applies.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nursery.config.storage.base import ObjectInfo, StorageError, missing_extra, timeout
from nursery.config.storage.credentials import from_file
from nursery.config.storage.url import CloudRoot

CHUNK = 1 << 20


def _sdk() -> tuple[Any, Any, Any, Any]:
    try:
        import azure.core
        import azure.core.exceptions as errors
        from azure.storage.blob import BlobServiceClient, ExponentialRetry
    except ImportError:
        raise missing_extra("as", "azure-storage-blob", "azure") from None
    return BlobServiceClient, errors, azure.core.MatchConditions, ExponentialRetry


def describe(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None) or getattr(exc, "status_code", None)
    message = str(getattr(exc, "reason", "") or exc).splitlines()[0]
    if getattr(exc, "status_code", None) == 412:
        return "PreconditionFailed: the object changed or was deleted since it was listed"
    if code:
        return f"{code}: {message}"
    return f"{type(exc).__name__}: {message}"


class AzureStore:
    def __init__(self, root: CloudRoot) -> None:
        service, self._errors, self._match, retry = _sdk()
        self.root = root
        cred = from_file(root)
        limit = timeout()
        # one retry after a second (the SDK's default waits 15 s, then 45 s, ...)
        options: dict[str, Any] = {
            "connection_timeout": limit, "read_timeout": limit,
            "retry_policy": retry(initial_backoff=1, increment_base=2, retry_total=1,
                                  random_jitter_range=1)}
        connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        try:
            if cred is None and connection:
                client = service.from_connection_string(connection, **options)
            else:
                if cred is None:
                    cred = {"account_str": os.environ.get("AZURE_STORAGE_ACCOUNT", ""),
                            "account_key": os.environ.get("AZURE_STORAGE_KEY", "")}
                account = cred.get("account_str") or root.account
                key = cred.get("account_key") or None
                credential = {"account_name": account, "account_key": key} if key else None
                client = service(f"https://{account}.blob.core.windows.net",
                                 credential=credential, **options)
        except (self._errors.AzureError, ValueError) as exc:
            raise StorageError(describe(exc)) from None
        self.container = client.get_container_client(root.bucket)

    def list(self) -> list[ObjectInfo]:
        prefix = f"{self.root.prefix}/" if self.root.prefix else ""
        try:
            return [ObjectInfo(blob.name[len(prefix):], int(blob.size or 0),
                               str(blob.etag or "").strip('"'))
                    for blob in self.container.list_blobs(name_starts_with=prefix or None)]
        except self._errors.AzureError as exc:
            raise StorageError(describe(exc)) from None

    def download(self, obj: ObjectInfo, dest: Path) -> None:
        kwargs: dict[str, Any] = {}
        if obj.tag:
            kwargs = {"etag": f'"{obj.tag}"', "match_condition": self._match.IfNotModified}
        try:
            stream = self.container.download_blob(self.root.key(obj.rel), **kwargs)
            with open(dest, "wb") as f:
                stream.readinto(f)
        except self._errors.AzureError as exc:
            raise StorageError(describe(exc)) from None
