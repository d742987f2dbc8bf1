"""Cloud repository URLs as Triton reads them (pure: text in, a frozen root out).

- ``s3://bucket/path``: AWS S3, virtual endpoint from the SDK's configuration;
- ``s3://host:port/bucket/path``: a path-style endpoint over plain HTTP (MinIO, a local
  server), ``s3://http://host:port/...`` the same, ``s3://https://host:port/...`` over TLS;
- ``gs://bucket/path``: Google Cloud Storage (``STORAGE_EMULATOR_HOST`` reaches an emulator);
- ``as://account/container/path``: Azure Blob Storage (``account`` may be written
  ``account.blob.core.windows.net``).

Repeated slashes are folded and trailing ones dropped, as Triton cleans its paths. A ``.`` or
``..`` component in the path is refused: a repository root names a folder, it never climbs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = ("s3://", "gs://", "as://")

_HOST_PORT = re.compile(r"^[0-9A-Za-z.\-]+:[0-9]{1,5}$")
_S3_BUCKET = re.compile(r"^[0-9a-z][0-9a-z.\-]{1,61}[0-9a-z]$")
_GS_BUCKET = re.compile(r"^[0-9a-z][0-9a-z._\-]{1,220}[0-9a-z]$")
_AS_ACCOUNT = re.compile(r"^[0-9a-z]{3,24}$")
_AS_CONTAINER = re.compile(r"^(\$root|[0-9a-z](?:[0-9a-z]|-(?!-)){1,61}[0-9a-z])$")
AZURE_HOST_SUFFIX = ".blob.core.windows.net"


def is_cloud_url(text: str) -> bool:
    return text.startswith(SCHEMES)


@dataclass(frozen=True, slots=True)
class CloudRoot:
    """A model repository in a bucket. ``error`` is set (and the rest empty) for a URL that
    could not be read: the repository is then unreadable with that reason, as a missing
    local folder is."""

    url: str  # as given on the command line: every message names it
    scheme: str = ""  # "s3", "gs" or "as"
    bucket: str = ""  # the S3 or GCS bucket, the Azure container
    prefix: str = ""  # the folder inside the bucket: "" or "a/b" (no slash at either end)
    endpoint: str = ""  # s3: "http://host:port" for a path-style endpoint, else ""
    account: str = ""  # as: the storage account
    error: str = ""

    def __str__(self) -> str:
        return self.url

    def key(self, rel: str) -> str:
        """The object key of ``rel`` (a path inside the repository)."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def child_url(self, rel: str) -> str:
        """The URL of ``rel`` inside the repository, for messages."""
        return f"{self.url.rstrip('/')}/{rel}"


def _fold(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def parse_root(url: str) -> CloudRoot:
    """Read a cloud repository URL; a malformed one comes back with ``error`` set."""
    try:
        return _parse(url)
    except ValueError as exc:
        return CloudRoot(url, error=f"malformed URL: {exc}")


def _parse(url: str) -> CloudRoot:
    if "\0" in url or any(c.isspace() for c in url):
        raise ValueError("it contains a blank or NUL character")
    scheme, rest = url[:2], url[5:]
    endpoint = ""
    if scheme == "s3":
        for proto in ("http://", "https://"):
            if rest.startswith(proto):
                rest = rest[len(proto):]
                endpoint = proto
                break
    parts = _fold(rest)
    if scheme == "s3" and parts and _HOST_PORT.match(parts[0]):
        endpoint = (endpoint or "http://") + parts.pop(0)
    elif endpoint:
        raise ValueError(f"'{endpoint}' must be followed by host:port")
    if scheme == "as":
        if not parts:
            raise ValueError("no storage account (as://account/container/path)")
        account = parts.pop(0)
        if account.endswith(AZURE_HOST_SUFFIX):
            account = account[: -len(AZURE_HOST_SUFFIX)]
        if not _AS_ACCOUNT.match(account):
            raise ValueError(f"'{account}' is not a storage account name")
    else:
        account = ""
    if not parts:
        what = "container" if scheme == "as" else "bucket"
        raise ValueError(f"no {what} name")
    bucket = parts.pop(0)
    pattern = {"s3": _S3_BUCKET, "gs": _GS_BUCKET, "as": _AS_CONTAINER}[scheme]
    if not pattern.match(bucket):
        what = "container" if scheme == "as" else "bucket"
        raise ValueError(f"'{bucket}' is not a valid {what} name")
    for part in parts:
        if part in (".", ".."):
            raise ValueError(f"the path may not contain '{part}'")
    return CloudRoot(url, scheme, bucket, "/".join(parts), endpoint, account)
