"""A stand-in for the MinIO server, for Triton's qa/L0_storage_S3_local.

    minio.py server [-C <config dir>] --address <host>:<port> <volume> ...

Triton's L0_storage_S3_local downloads MinIO at test time, runs it on 127.0.0.1:4572, fills
buckets with the AWS CLI and serves model repositories from them (``s3://<host>:4572/...``).
This serves the same S3 API on that address with moto's S3 server (path-style requests, every
object in memory: nothing is written to the volume folders). As MinIO, it serves only requests
signed (AWS Signature Version 4, in the Authorization header) with the credentials in
``MINIO_ACCESS_KEY`` / ``MINIO_SECRET_KEY`` (``MINIO_ROOT_USER`` / ``MINIO_ROOT_PASSWORD``;
minioadmin / minioadmin without them): anything else gets 403, with MinIO's error body except
for HEAD. SIGTERM / SIGINT stop it.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import io
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, quote

from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/([0-9]{8})/([^/]+)/([^/]+)/aws4_request,"
                   r"\s*SignedHeaders=([^,]+),\s*Signature=([0-9a-f]{64})")
_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SignatureDoesNotMatch</Code>'
           b"<Message>The request signature we calculated does not match the signature you "
           b"provided. Check your key and signing method.</Message></Error>")


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def signature_ok(environ: dict[str, Any], key_id: str, secret: str) -> bool:
    """Whether a request is signed (SigV4, Authorization header) with these credentials: the
    canonical request rebuilt from what arrived (the path as sent, the query sorted and
    encoded, the signed headers), then the signature recomputed."""
    match = _AUTH.fullmatch(environ.get("HTTP_AUTHORIZATION", "").strip())
    if match is None:
        return False
    given_id, date, region, service, signed, signature = match.groups()
    if given_id != key_id:
        return False
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or quote(
        environ.get("PATH_INFO", "/"))
    path = raw.split("?", 1)[0] or "/"
    pairs = sorted((_encode(k), _encode(v)) for k, v in parse_qsl(
        environ.get("QUERY_STRING", ""), keep_blank_values=True))
    query = "&".join(f"{k}={v}" for k, v in pairs)
    headers = []
    for name in signed.split(";"):
        if name == "host":
            value = environ.get("HTTP_HOST", "")
        elif name == "content-type":
            value = environ.get("CONTENT_TYPE", "")
        elif name == "content-length":
            value = environ.get("CONTENT_LENGTH", "")
        else:
            value = environ.get("HTTP_" + name.upper().replace("-", "_"), "")
        headers.append(f"{name}:{' '.join(value.split())}\n")
    payload = environ.get("HTTP_X_AMZ_CONTENT_SHA256", "UNSIGNED-PAYLOAD")
    canonical = "\n".join([environ.get("REQUEST_METHOD", "GET"), path, query, "".join(headers),
                           signed, payload])
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", environ.get("HTTP_X_AMZ_DATE", ""), scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(("AWS4" + secret).encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


_ISSUED = re.compile(rb"<AccessKeyId>([^<]+)</AccessKeyId>\s*<SecretAccessKey>([^<]+)"
                     rb"</SecretAccessKey>")


def checked(app: Callable[..., Iterable[bytes]], key_id: str, secret: str
            ) -> Callable[..., Iterable[bytes]]:
    """``app`` behind MinIO's check: a request not signed with these credentials, or with
    temporary ones this server's STS issued (``aws sts get-session-token``: Triton's
    L0_storage_S3), gets 403."""
    keys = {key_id: secret}

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        match = _AUTH.search(environ.get("HTTP_AUTHORIZATION", ""))
        known = keys.get(match.group(1)) if match else None
        if match and "HTTP_X_AMZ_CONTENT_SHA256" not in environ:  # STS: the form is signed
            size = int(environ.get("CONTENT_LENGTH") or 0)
            form = environ["wsgi.input"].read(size) if size else b""
            environ["wsgi.input"] = io.BytesIO(form)
            environ["HTTP_X_AMZ_CONTENT_SHA256"] = hashlib.sha256(form).hexdigest()
        if known is not None and signature_ok(environ, match.group(1), known):  # type: ignore[union-attr]
            if match.group(4) != "sts":  # type: ignore[union-attr]
                return app(environ, start_response)
            body = b"".join(app(environ, start_response))
            for issued_id, issued_secret in _ISSUED.findall(body):
                keys[issued_id.decode()] = issued_secret.decode()
            return [body]
        body = b"" if environ.get("REQUEST_METHOD") == "HEAD" else _DENIED
        start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                         ("Content-Length", str(len(body)))])
        return [body]
    return wsgi


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="minio")
    parser.add_argument("command", choices=["server"])
    parser.add_argument("-C", "--config-dir", default="")
    parser.add_argument("--address", default=":9000")
    parser.add_argument("volumes", nargs="*")
    args = parser.parse_intermixed_args(argv)
    host, _, port = args.address.rpartition(":")
    key_id = os.environ.get("MINIO_ACCESS_KEY") or os.environ.get("MINIO_ROOT_USER", "minioadmin")
    secret = os.environ.get("MINIO_SECRET_KEY") or os.environ.get("MINIO_ROOT_PASSWORD",
                                                                  "minioadmin")
    app = checked(DomainDispatcherApplication(create_backend_app), key_id, secret)
    server = make_server(host or "127.0.0.1", int(port), app, threaded=True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    print(f"minio (nursery-qa stand-in, moto's S3): API: http://{host or '127.0.0.1'}:{port}",
          flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.shutdown()
    serving.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
