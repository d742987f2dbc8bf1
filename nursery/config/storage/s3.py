"""S3 (and S3-compatible endpoints) through boto3, the ``s3`` extra.

Credentials as Triton takes them: ``AWS_ACCESS_KEY_ID`` with ``AWS_SECRET_ACCESS_KEY`` (and
``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``), else ``AWS_PROFILE``, else the SDK's default
chain; or the entry of ``TRITON_CLOUD_CREDENTIAL_PATH`` (``key_id``, ``secret_key``,
``region``, ``session_token``, ``profile``). Addressing is path-style, as in Triton.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from nursery.config.storage.base import ObjectInfo, StorageError, missing_extra, timeout
from nursery.config.storage.credentials import from_file
from nursery.config.storage.url import CloudRoot

CHUNK = 1 << 20
_CHECK = "Unable to create S3 filesystem client. Check account credentials. "


def _boto() -> tuple[Any, Any, Any]:
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError:
        raise missing_extra("s3", "boto3", "s3") from None
    return boto3, botocore.config, botocore.exceptions


def describe(exc: BaseException) -> str:
    """A botocore error in words: the service's code and message, or the client's."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        code = error.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = error.get("Message") or ""
        if str(code) in ("404", "NoSuchKey"):
            return f"NoSuchKey: the object does not exist{': ' + message if message else ''}"
        if str(code) == "412":
            return "PreconditionFailed: the object changed or was deleted since it was listed"
        return f"{code}: {message}" if message else str(code)
    return f"{type(exc).__name__}: {exc}"


class S3Store:
    def __init__(self, root: CloudRoot) -> None:
        boto3, config, self._errors = _boto()
        self.root = root
        cred = from_file(root)
        if cred is None:
            cred = {"key_id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
                    "secret_key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                    "session_token": os.environ.get("AWS_SESSION_TOKEN", ""),
                    "region": os.environ.get("AWS_DEFAULT_REGION", ""),
                    "profile": os.environ.get("AWS_PROFILE", "")}
        session_args: dict[str, Any] = {}
        if cred.get("key_id") and cred.get("secret_key"):
            session_args = {"aws_access_key_id": cred["key_id"],
                            "aws_secret_access_key": cred["secret_key"],
                            "aws_session_token": cred.get("session_token") or None}
        elif cred.get("profile"):
            session_args = {"profile_name": cred["profile"]}
        if cred.get("region"):
            session_args["region_name"] = cred["region"]
        try:
            session = boto3.session.Session(**session_args)
            limit = timeout()
            self.client = session.client(
                "s3", endpoint_url=root.endpoint or None,
                config=config.Config(
                    s3={"addressing_style": "path"}, connect_timeout=limit,
                    read_timeout=limit, retries={"max_attempts": 2, "mode": "standard"},
                    max_pool_connections=16))
        except self._errors.BotoCoreError as exc:
            raise StorageError(describe(exc)) from None
        self._check_bucket()

    def _check_bucket(self) -> None:
        """Whether the bucket answers these credentials (a HEAD of the bucket), as Triton
        checks before it reads anything; refused in Triton's words (a HEAD answer has no
        body: the AWS SDK's "No response body."), then the HTTP status."""
        try:
            self.client.head_bucket(Bucket=self.root.bucket)
        except self._errors.ClientError as exc:
            error = exc.response.get("Error") or {}
            status = " ".join(str(error.get(k) or "") for k in ("Code", "Message")).strip()
            raise StorageError(f"{_CHECK}Exception: '' Message: 'No response body.' (HTTP "
                               f"{status or 'error'})") from None
        except self._errors.BotoCoreError as exc:
            raise StorageError(f"{_CHECK}Exception: '{type(exc).__name__}' Message: "
                               f"'{exc}'") from None

    def list(self) -> list[ObjectInfo]:
        prefix = f"{self.root.prefix}/" if self.root.prefix else ""
        out: list[ObjectInfo] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.root.bucket, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents", ()):
                    out.append(ObjectInfo(obj["Key"][len(prefix):], int(obj["Size"]),
                                          obj.get("ETag", "").strip('"')))
        except (self._errors.BotoCoreError, self._errors.ClientError) as exc:
            raise StorageError(describe(exc)) from None
        return out

    def download(self, obj: ObjectInfo, dest: Path) -> None:
        args: dict[str, Any] = {"Bucket": self.root.bucket, "Key": self.root.key(obj.rel)}
        if obj.tag:
            args["IfMatch"] = f'"{obj.tag}"'
        try:
            body = self.client.get_object(**args)["Body"]
            with body, open(dest, "wb") as f:
                shutil.copyfileobj(body, f, CHUNK)
        except (self._errors.BotoCoreError, self._errors.ClientError) as exc:
            raise StorageError(describe(exc)) from None
