"""Real object-storage servers on loopback for the tests of cloud repositories, and a way
to upload a model repository to them through each cloud's own SDK.

- S3: moto's standalone server (``ThreadedMotoServer``, in this process);
- GCS: gcp-storage-emulator (in this process; ``STORAGE_EMULATOR_HOST`` points at it);
- Azure: Azurite's blob service (node, installed by scripts/install_azurite.sh, a subprocess);
- Redis (the response cache's ``--cache-config redis,...``): ``redis-server``, installed by
  scripts/install_redis.sh, a subprocess (:func:`redis_server`).

Each is a context manager yielding a :class:`Cloud`: the URL of a repository in a fresh
bucket, the environment a client (nursery or a test) needs to reach it, and ``put`` /
``delete`` to change the bucket while a server watches it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, free_port

AZURITE = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, in Microsoft's documentation)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")


@dataclass
class Cloud:
    scheme: str
    url: str  # the repository root: <scheme>://.../<bucket>/models
    env: dict[str, str]  # what a client needs in its environment to reach the server
    put_bytes: Callable[[str, bytes], None]  # key relative to the root -> content
    delete: Callable[[str], None]
    keys: Callable[[], list[str]]
    extra: dict[str, Any] = field(default_factory=dict)

    def put(self, local: Path, under: str = "") -> None:
        """Upload every file under ``local`` (a repository or a model folder)."""
        for path in sorted(local.rglob("*")):
            if path.is_file():
                rel = path.relative_to(local).as_posix()
                self.put_bytes(f"{under}/{rel}" if under else rel, path.read_bytes())


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None = None,
               timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"storage server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@contextmanager
def _listening(proc: subprocess.Popen[bytes], port: int) -> Iterator[int]:
    """``port`` once the server ``proc`` listens on it; the server ended on exit (terminated,
    killed after 10 s)."""
    try:
        _wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bucket_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


S3_ENV = {"AWS_ACCESS_KEY_ID": "nursery-test", "AWS_SECRET_ACCESS_KEY": "nursery-secret",
          "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_server() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        _wait_port(port)
        yield port
    finally:
        server.stop()


def s3_cloud(port: int, bucket: str | None = None, prefix: str = "models") -> Cloud:
    import boto3

    bucket = bucket or bucket_name("nursery")
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                          aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
                          region_name="us-east-1")
    client.create_bucket(Bucket=bucket)

    def key(rel: str) -> str:
        return f"{prefix}/{rel}" if prefix else rel

    def put(rel: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=key(rel), Body=data)

    def delete(rel: str) -> None:
        client.delete_object(Bucket=bucket, Key=key(rel))

    def keys() -> list[str]:
        listing = client.list_objects_v2(Bucket=bucket, Prefix=key(""))
        return sorted(o["Key"][len(key("")):] for o in listing.get("Contents", ()))

    url = f"s3://127.0.0.1:{port}/{bucket}" + (f"/{prefix}" if prefix else "")
    return Cloud("s3", url, dict(S3_ENV), put, delete, keys, {"client": client, "bucket": bucket})


@contextmanager
def s3() -> Iterator[Cloud]:
    with moto_server() as port:
        yield s3_cloud(port)


@contextmanager
def gcs_server() -> Iterator[int]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        _wait_port(port)
        yield port
    finally:
        server.stop()


def gcs_cloud(port: int, prefix: str = "models") -> Cloud:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    host = f"http://127.0.0.1:{port}"
    env = {"STORAGE_EMULATOR_HOST": host}
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = host
    try:
        client = storage.Client(project="nursery", credentials=AnonymousCredentials())
    finally:
        if old is None:
            del os.environ["STORAGE_EMULATOR_HOST"]
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old
    name = bucket_name("nursery")
    bucket = client.create_bucket(name)

    def put(rel: str, data: bytes) -> None:
        bucket.blob(f"{prefix}/{rel}").upload_from_string(data)

    def delete(rel: str) -> None:
        bucket.blob(f"{prefix}/{rel}").delete()

    def keys() -> list[str]:
        return sorted(b.name[len(prefix) + 1:]
                      for b in client.list_blobs(name, prefix=f"{prefix}/"))

    return Cloud("gs", f"gs://{name}/{prefix}", env, put, delete, keys, {"bucket": name})


@contextmanager
def gcs() -> Iterator[Cloud]:
    with gcs_server() as port:
        yield gcs_cloud(port)


def azurite_connection(port: int) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")


@contextmanager
def azurite_server(workdir: Path) -> Iterator[int]:
    if not AZURITE.exists():
        raise RuntimeError(f"Azurite is not installed at {AZURITE}: run "
                           "scripts/install_azurite.sh (the project's install step, .ci/run)")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = open(workdir / "azurite.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
         str(workdir), "--silent", "--skipApiVersionCheck", "--loose"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        with _listening(proc, port):
            yield port
    finally:
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def azure_cloud(port: int, prefix: str = "models") -> Cloud:
    from azure.storage.blob import BlobServiceClient

    connection = azurite_connection(port)
    service = BlobServiceClient.from_connection_string(connection)
    name = bucket_name("nursery")
    container = service.create_container(name)

    def put(rel: str, data: bytes) -> None:
        container.upload_blob(f"{prefix}/{rel}", data, overwrite=True)

    def delete(rel: str) -> None:
        container.delete_blob(f"{prefix}/{rel}")

    def keys() -> list[str]:
        return sorted(b.name[len(prefix) + 1:]
                      for b in container.list_blobs(name_starts_with=f"{prefix}/"))

    return Cloud("as", f"as://{AZURITE_ACCOUNT}/{name}/{prefix}",
                 {"AZURE_STORAGE_CONNECTION_STRING": connection}, put, delete, keys,
                 {"container": name, "port": port})


@contextmanager
def azure(workdir: Path) -> Iterator[Cloud]:
    with azurite_server(workdir) as port:
        yield azure_cloud(port)


@contextmanager
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers: a storage server that
    stopped answering."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@contextmanager
def redis_server(workdir: Path, port: int | None = None, password: str | None = None,
                 tls: tuple[Path, Path, Path] | None = None,
                 client_certs: bool = False) -> Iterator[int]:
    """A real Redis server on a free loopback port (or ``port``), with no persistence;
    ``password``: its ``requirepass``; ``tls``: (certificate, key, CA) to serve TLS only on
    that port, asking clients for a certificate the CA signed when ``client_certs``."""
    if not Path(REDIS_SERVER).exists():
        raise RuntimeError("redis-server is not installed: run scripts/install_redis.sh (the "
                           "project's install step, .ci/run)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir), "--logfile",
            str(workdir / f"redis-{port}.log")]
    if password:
        args += ["--requirepass", password]
    if tls is not None:
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls[0]),
                 "--tls-key-file", str(tls[1]), "--tls-ca-cert-file", str(tls[2]),
                 "--tls-auth-clients", "yes" if client_certs else "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    with _listening(proc, port):
        yield port
