"""TLS for the HTTP and gRPC ports: the server's ``ssl.SSLContext`` from the flags' files.

gRPC (Triton's flags): ``--grpc-use-ssl`` with ``--grpc-server-cert`` / ``--grpc-server-key``;
``--grpc-use-ssl-mutual`` also asks every client for a certificate signed by
``--grpc-root-cert`` and refuses the handshake of a client without one. ALPN offers ``h2``
(gRPC clients insist on it). HTTP (nursery only: Triton's HTTP port has no TLS):
``--http-ssl-cert`` / ``--http-ssl-key``, ALPN ``http/1.1``.

The context is built once at start-up; a file that cannot be read, a key that does not match
its certificate or a root certificate that is not one stops the start-up with the reason
(:class:`TlsError`). The handshake itself happens on each connection's first read, in its own
task, under the connection's own deadline (the HTTP head timeout, the gRPC handshake
timeout): a client that speaks plain text to a TLS port, or fails the handshake, costs its
connection only.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


class TlsError(Exception):
    """The TLS files given cannot make a server context (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str
    key: str
    root: str = ""  # the CA that client certificates must chain to (mutual TLS)
    mutual: bool = False


def server_context(files: TlsFiles, alpn: list[str], flag: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 at least); ``flag`` names the flags in errors."""
    for path in (files.cert, files.key, *((files.root,) if files.mutual else ())):
        _readable(path, flag)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"{flag}: cannot use the certificate '{files.cert}' with the key "
                       f"'{files.key}': {exc}") from None
    if files.mutual:
        if not files.root:
            raise TlsError(f"{flag}: mutual TLS needs the root certificate that client "
                           "certificates are checked against (--grpc-root-cert)")
        try:
            context.load_verify_locations(cafile=files.root)
        except (ssl.SSLError, OSError) as exc:
            raise TlsError(f"{flag}: cannot use the root certificate '{files.root}': "
                           f"{exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(alpn)
    return context


def _readable(path: str, flag: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TlsError(f"{flag}: cannot read '{path}': {exc.strerror}") from None


__all__ = ["TlsError", "TlsFiles", "server_context"]
