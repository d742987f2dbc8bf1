"""Google Cloud Storage through google-cloud-storage, the ``gcs`` extra.

Credentials: the service-account file named by ``GOOGLE_APPLICATION_CREDENTIALS`` (or by the
``TRITON_CLOUD_CREDENTIAL_PATH`` entry), else the SDK's default credentials, else anonymous
access (public buckets), as Triton does. ``STORAGE_EMULATOR_HOST`` reaches an emulator (the
SDK reads it), with anonymous access unless a credential is given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nursery.config.storage.base import ObjectInfo, StorageError, missing_extra, timeout
from nursery.config.storage.credentials import from_file
from nursery.config.storage.url import CloudRoot

EMULATOR_PROJECT = "nursery"  # an emulator wants a project name; it checks none


def _sdk() -> tuple[Any, Any, Any, Any, Any, Any]:
    try:
        import google.api_core.exceptions as api_errors
        import google.auth.exceptions as auth_errors
        import requests
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY
    except ImportError:
        raise missing_extra("gs", "google-cloud-storage", "gcs") from None
    return storage, api_errors, auth_errors, requests, AnonymousCredentials, DEFAULT_RETRY


def describe(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None)
    if code == 404:  # the SDK's message is the whole request and response: not for people
        return "NotFound: the bucket or the object does not exist"
    if code == 412:
        return "PreconditionFailed: the object changed or was deleted since it was listed"
    if code is not None:
        return f"{code} {type(exc).__name__}: {message or exc}"
    return f"{type(exc).__name__}: {exc}"


class GcsStore:
    def __init__(self, root: CloudRoot) -> None:
        storage, api_errors, auth_errors, requests, anonymous, retry = _sdk()
        # the SDK retries for two minutes by default: a server that stops answering would
        # hold a load that long; retry within one timeout instead
        self.retry = retry.with_timeout(timeout())
        self._errors: tuple[type[BaseException], ...] = (
            api_errors.GoogleAPIError, auth_errors.GoogleAuthError,
            requests.exceptions.RequestException)
        self.root = root
        path = from_file(root)
        if path is None:
            path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or None
        try:
            if path:
                self.client = storage.Client.from_service_account_json(path)
            elif os.environ.get("STORAGE_EMULATOR_HOST"):
                self.client = storage.Client(project=EMULATOR_PROJECT, credentials=anonymous())
            else:
                try:
                    self.client = storage.Client()
                except auth_errors.DefaultCredentialsError:
                    self.client = storage.Client.create_anonymous_client()
        except (*self._errors, OSError, ValueError) as exc:
            raise StorageError(describe(exc)) from None
        # google-cloud-storage 3.x fetches each bucket's metadata on a thread of its own, for
        # its OpenTelemetry span attributes only: one more request per bucket, and a thread
        # that retries on the SDK's defaults (minutes, not our timeout) against a server that
        # stopped answering, after our call has failed. Left out (the SDK checks for None).
        if getattr(self.client, "_bucket_metadata_cache", None) is not None:
            self.client._bucket_metadata_cache = None
        self.bucket = self.client.bucket(root.bucket)

    def list(self) -> list[ObjectInfo]:
        prefix = f"{self.root.prefix}/" if self.root.prefix else ""
        try:
            return [ObjectInfo(blob.name[len(prefix):], int(blob.size or 0),
                               str(blob.generation or blob.etag or ""))
                    for blob in self.client.list_blobs(self.root.bucket, prefix=prefix,
                                                       timeout=timeout(), retry=self.retry)]
        except self._errors as exc:
            raise StorageError(describe(exc)) from None

    def download(self, obj: ObjectInfo, dest: Path) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout(), "retry": self.retry}
        if obj.tag.isdigit():
            kwargs["if_generation_match"] = int(obj.tag)
        try:
            with open(dest, "wb") as f:
                self.bucket.blob(self.root.key(obj.rel)).download_to_file(f, **kwargs)
        except self._errors as exc:
            raise StorageError(describe(exc)) from None
