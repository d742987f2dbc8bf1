"""The locked doors end to end (issue 25, docs/security.md), with tritonclient against real
servers: TLS and mutual TLS on the gRPC port (Triton's flags), TLS on the HTTP port
(nursery's), Triton's restricted API groups on both ports, headers forwarded to a Python model
as request parameters, client shared memory and model file uploads off by default, the chunk
cap, and the flags that stop a start-up. Certificates are made here with ``cryptography``.
Every refusal costs its own connection or request: the server keeps serving the others."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

import gevent.ssl
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, make_models

MODELS = Path(__file__).resolve().parents[1] / "models"
GRPC_PREFIX = "triton-grpc-protocol-"

# -- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(folder: Path, stem: str, cert: x509.Certificate,
           key: ec.EllipticCurvePrivateKey) -> Issued:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Issued(cert_path, key_path)


class Authority:
    """A certificate authority of the test's own, which signs server and client
    certificates."""

    def __init__(self, folder: Path, cn: str) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False,
                                         False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256()))
        self.path = _write(folder, cn, self.cert, self.key).cert

    def issue(self, stem: str, *, server: bool, days: tuple[int, int] = (-1, 30)) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days[0]))
            .not_valid_after(now + datetime.timedelta(days=days[1]))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        return _write(self.folder, stem, builder.sign(self.key, hashes.SHA256()), key)


@dataclass(frozen=True)
class Pki:
    ca: Authority
    other_ca: Authority  # signs nothing the servers trust
    server: Issued
    client: Issued
    stranger: Issued  # a client certificate from other_ca
    expired: Issued  # a client certificate from ca, out of date


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Authority(folder, "nursery-test-ca"), Authority(folder, "other-ca")
    return Pki(ca, other, ca.issue("server", server=True), ca.issue("client", server=False),
               other.issue("stranger", server=False),
               ca.issue("expired", server=False, days=(-10, -1)))


def _client_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


# -- servers --------------------------------------------------------------------------------


def _repo(folder: Path) -> Path:
    make_models.write_add_sub(folder)
    shutil.copytree(MODELS / "py_params", folder / "py_params")
    return folder


def _start(folder: Path, *flags: str, tls: ssl.SSLContext | None = None) -> ServerProcess:
    proc = ServerProcess(_repo(folder / "repo"), *flags, log_path=folder / "server.log")
    try:
        proc.wait_ready(tls=tls)
    except BaseException:
        proc.stop()
        raise
    return proc


def _stop(proc: ServerProcess) -> None:
    """Stopped cleanly, and no refusal on the way cost the server an internal error."""
    code = proc.stop()
    log = proc.log()
    assert code == 0, f"server exit code {code}:\n{log}"
    assert "internal error" not in log.lower(), log


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """gRPC over TLS (--grpc-use-ssl), HTTPS on the HTTP port."""
    proc = _start(tmp_path_factory.mktemp("tls"), "--grpc-use-ssl=true",
                  f"--grpc-server-cert={pki.server.cert}", f"--grpc-server-key={pki.server.key}",
                  f"--http-ssl-cert={pki.server.cert}", f"--http-ssl-key={pki.server.key}",
                  tls=_client_context(pki.ca.path))
    yield proc
    _stop(proc)


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """gRPC over mutual TLS (--grpc-use-ssl-mutual); the HTTP port in clear text."""
    proc = _start(tmp_path_factory.mktemp("mtls"), "--grpc-use-ssl-mutual=true",
                  f"--grpc-server-cert={pki.server.cert}", f"--grpc-server-key={pki.server.key}",
                  f"--grpc-root-cert={pki.ca.path}")
    yield proc
    _stop(proc)


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Triton's L0_http / L0_grpc restricted set-ups, both ports, plus forwarded headers; no
    --allow-client-shm, no --allow-model-file-upload (explicit mode, so that loads reach
    the file-upload check). py_params runs in a stub process here (the forwarded headers
    cross the stub's wire) and on the server's thread in the card-servers test."""
    proc = _start(tmp_path_factory.mktemp("locked"),
                  "--model-control-mode=explicit", "--load-model=add_sub",
                  "--load-model=py_params", "--backend-config=python,nursery-instance-mode=process",
                  "--http-restricted-api=model-repository:admin-key=admin-value",
                  "--http-restricted-api=inference,metadata:infer-key=infer-value",
                  "--grpc-restricted-protocol=model-repository:admin-key=admin-value",
                  "--grpc-restricted-protocol=inference,health:infer-key=infer-value",
                  "--http-header-forward-pattern=MY_HEADER.*|sequence_id|triton_.*",
                  "--grpc-header-forward-pattern=my_header.*|priority")
    yield proc
    _stop(proc)


def _add_sub_inputs(module: object) -> tuple[list[object], np.ndarray]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"),  # type: ignore[attr-defined]
              module.InferInput("INPUT1", [1, 16], "FP32")]  # type: ignore[attr-defined]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)  # type: ignore[attr-defined]
    return inputs, a


def _grpc(proc: ServerProcess, **kw: object) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}", **kw)  # type: ignore[arg-type]


def _https(proc: ServerProcess, pki: Pki) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        proc.url, ssl=True, insecure=True,  # the context checks the name (an IP: its SAN)
        ssl_context_factory=lambda: gevent.ssl.create_default_context(cafile=str(pki.ca.path)))


def _raw_exchange(port: int, data: bytes, wrap: ssl.SSLContext | None = None) -> bytes:
    """Send ``data`` and read until the server closes (or 10 s of silence)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        conn: socket.socket = (wrap.wrap_socket(sock, server_hostname="127.0.0.1")
                               if wrap is not None else sock)
        conn.sendall(data)
        out = b""
        while True:
            try:
                piece = conn.recv(65536)
            except (ConnectionResetError, TimeoutError, ssl.SSLError):
                break
            if not piece:
                break
            out += piece
        return out


# -- TLS ------------------------------------------------------------------------------------


def test_grpc_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    with _grpc(tls_server, ssl=True, root_certificates=str(pki.ca.path)) as client:
        assert client.is_server_live()
        inputs, a = _add_sub_inputs(grpcclient)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_http_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    client = _https(tls_server, pki)
    assert client.is_server_ready()
    inputs, a = _add_sub_inputs(httpclient)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT1"), 0 * a)
    client.close()


def test_plain_text_to_tls_ports_costs_only_that_connection(tls_server: ServerProcess,
                                                            pki: Pki) -> None:
    # an HTTP request in clear text to the HTTPS port: the handshake fails, the connection
    # closes, nothing is answered in clear text
    answer = _raw_exchange(tls_server.http_port, b"GET /v2/health/live HTTP/1.1\r\n"
                           b"host: x\r\n\r\n")
    assert not answer.startswith(b"HTTP/1.1")
    # a gRPC client without TLS to the TLS port: UNAVAILABLE on the client's side
    with _grpc(tls_server) as plain, pytest.raises(InferenceServerException) as err:
        plain.is_server_live(client_timeout=10)
    assert err.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    # a client that trusts another authority refuses the server's certificate
    with pytest.raises(ssl.SSLCertVerificationError):
        _raw_exchange(tls_server.http_port, b"", _client_context(pki.other_ca.path))
    # everyone else is served
    assert _https(tls_server, pki).is_server_live()
    with _grpc(tls_server, ssl=True, root_certificates=str(pki.ca.path)) as client:
        assert client.is_server_live()


def test_tls_client_to_a_clear_text_port(locked: ServerProcess) -> None:
    """The reverse: a TLS ClientHello to the clear-text HTTP and gRPC ports is a malformed
    request there (HTTP 400, HTTP/2 GOAWAY), and the ports go on."""
    context = ssl.create_default_context()
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        _raw_exchange(locked.http_port, b"GET / HTTP/1.1\r\n\r\n", context)
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        _raw_exchange(locked.grpc_port, b"", context)
    assert httpclient.InferenceServerClient(locked.url).is_server_live()


def test_mutual_tls(mtls_server: ServerProcess, pki: Pki) -> None:
    def client(issued: Issued | None) -> grpcclient.InferenceServerClient:
        extra = {"private_key": str(issued.key), "certificate_chain": str(issued.cert)} \
            if issued is not None else {}
        return _grpc(mtls_server, ssl=True, root_certificates=str(pki.ca.path), **extra)

    with client(pki.client) as good:
        assert good.is_server_live()
        inputs, a = _add_sub_inputs(grpcclient)
        np.testing.assert_array_equal(good.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * a)
    # without a certificate, with one from another authority, with an expired one: the
    # handshake is refused, the client sees UNAVAILABLE
    for issued in (None, pki.stranger, pki.expired):
        with client(issued) as refused, pytest.raises(InferenceServerException) as err:
            refused.is_server_live(client_timeout=10)
        assert err.value.status() in ("StatusCode.UNAVAILABLE",
                                      "StatusCode.DEADLINE_EXCEEDED"), issued
    with client(pki.client) as good:
        assert good.is_server_ready()


# -- restricted groups ----------------------------------------------------------------------

INFER_KEY = {"infer-key": "infer-value"}
ADMIN_KEY = {"admin-key": "admin-value"}


def test_http_restricted_api(locked: ServerProcess) -> None:
    """Triton's qa/L0_http/http_restricted_api_test.py, plus the 403 itself."""
    client = httpclient.InferenceServerClient(locked.url)
    # groups not named stay open
    client.get_inference_statistics("add_sub")
    assert client.is_server_live()
    # model-repository: admin-key only
    with pytest.raises(InferenceServerException, match="This API is restricted") as err:
        client.unload_model("add_sub", headers=INFER_KEY)
    assert err.value.status() == "403"
    assert err.value.message() == "This API is restricted, expecting header 'admin-key'"
    client.get_model_repository_index(headers=ADMIN_KEY)
    # metadata and inference: infer-key with its value
    for headers in ({}, {"infer-key": "wrong"}, ADMIN_KEY):
        with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
            client.get_server_metadata(headers=headers)
    assert client.get_server_metadata(headers=INFER_KEY)["name"] == "triton"
    inputs, a = _add_sub_inputs(httpclient)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        client.infer("add_sub", inputs, headers={"test": "1"})
    # an unknown model is refused as restricted first (Triton checks before the model)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        client.infer("nope", inputs)
    result = client.infer("add_sub", inputs, headers=INFER_KEY)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    # a raw request: 403 and the JSON error; the connection goes on
    answer = _raw_exchange(locked.http_port, b"GET /v2 HTTP/1.1\r\nhost: x\r\n"
                           b"connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert answer.endswith(b'{"error":"This API is restricted, expecting header \'infer-key\'"}')


def test_grpc_restricted_protocol(locked: ServerProcess) -> None:
    """Triton's qa/L0_grpc/python_unit_test.py RestrictedProtocolTest."""
    infer_key = {GRPC_PREFIX + "infer-key": "infer-value"}
    admin_key = {GRPC_PREFIX + "admin-key": "admin-value"}
    with _grpc(locked) as client:
        client.get_inference_statistics("add_sub")
        client.get_server_metadata()  # metadata is open on this port
        with pytest.raises(InferenceServerException, match="This protocol is restricted") as err:
            client.unload_model("add_sub", headers=infer_key)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert err.value.message() == ("This protocol is restricted, expecting header "
                                       f"'{GRPC_PREFIX}admin-key'")
        client.get_model_repository_index(headers=admin_key)
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            client.is_server_live()
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            client.is_server_live(headers={"infer-key": "infer-value"})  # without the prefix
        assert client.is_server_live(headers=infer_key)
        inputs, a = _add_sub_inputs(grpcclient)
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            client.infer("add_sub", inputs, headers={"test": "1"})
        result = client.infer("add_sub", inputs, headers=infer_key)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_grpc_restricted_stream(locked: ServerProcess) -> None:
    infer_key = {GRPC_PREFIX + "infer-key": "infer-value"}
    inputs, a = _add_sub_inputs(grpcclient)
    results: Queue[object] = Queue()
    with _grpc(locked) as client:
        client.start_stream(lambda result, error: results.put(error or result),
                            headers={"test": "1"})
        try:  # the server may have ended the stream already (Triton's test sees this)
            client.async_stream_infer("add_sub", inputs)
        except InferenceServerException as exc:
            ended = exc.message()
        else:
            ended = "no longer in valid state"
        assert "no longer in valid state" in ended
        refused = results.get(timeout=30)
        assert isinstance(refused, InferenceServerException)
        assert "This protocol is restricted" in refused.message()
        client.stop_stream()
        client.start_stream(lambda result, error: results.put(error or result),
                            headers=infer_key)
        client.async_stream_infer("add_sub", inputs)
        answer = results.get(timeout=30)
        client.stop_stream()
    assert isinstance(answer, grpcclient.InferResult), answer
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), 2 * a)


# -- headers forwarded to the model ---------------------------------------------------------


def _params_input(module: object) -> list[object]:
    tensor = module.InferInput("INPUT0", [1], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
    return [tensor]


def test_http_headers_reach_the_model(locked: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(locked.url)
    headers = {**INFER_KEY, "my_header_1": "my_value_1",
               "My_Header_2": 'a "quoted" string\\ ', "header_3": "not forwarded"}
    result = client.infer("py_params", _params_input(httpclient), headers=headers,
                          parameters={"key1": "value1"})
    params = json.loads(result.as_numpy("PARAMETERS")[0])
    # the pattern matches whatever the case (Triton's (?i)); names arrive lower-cased; a
    # value keeps its trailing whitespace, as Triton's HTTP parser keeps it (L0_parameters)
    assert params == {"key1": "value1", "my_header_1": "my_value_1",
                      "my_header_2": 'a "quoted" string\\ '}
    for reserved in ("sequence_id", "triton_x"):
        with pytest.raises(InferenceServerException) as err:
            client.infer("py_params", _params_input(httpclient),
                         headers={**INFER_KEY, reserved: "1"})
        assert err.value.message() == (f"Header '{reserved}' is reserved for Triton usage and "
                                       "cannot be forwarded.")
        assert err.value.status() == "400"


def test_grpc_metadata_reaches_the_model(locked: ServerProcess) -> None:
    infer_key = {GRPC_PREFIX + "infer-key": "infer-value"}
    with _grpc(locked) as client:
        result = client.infer("py_params", _params_input(grpcclient),
                              headers={**infer_key, "my_header_1": "v1", "other": "x"},
                              parameters={"n": 3})
        assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"n": 3, "my_header_1": "v1"}
        with pytest.raises(InferenceServerException, match="reserved for Triton usage") as err:
            client.infer("py_params", _params_input(grpcclient),
                         headers={**infer_key, "priority": "1"})
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        # over a stream: each request carries the stream's forwarded metadata
        results: Queue[object] = Queue()
        client.start_stream(lambda result, error: results.put(error or result),
                            headers={**infer_key, "my_header_9": "streamed"})
        client.async_stream_infer("py_params", _params_input(grpcclient))
        answer = results.get(timeout=60)
        client.stop_stream()
    assert isinstance(answer, grpcclient.InferResult), answer
    assert json.loads(answer.as_numpy("PARAMETERS")[0]) == {"my_header_9": "streamed"}


def test_reserved_parameters_refused(locked: ServerProcess) -> None:
    """Every ``triton_`` parameter over HTTP (Triton's http_server.cc); over gRPC all but
    ``triton_enable_empty_final_response`` (its infer_handler.cc)."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}],
            "parameters": {"triton_enable_empty_final_response": True}}
    raw = json.dumps(body).encode()
    answer = _raw_exchange(locked.http_port, (
        f"POST /v2/models/py_params/infer HTTP/1.1\r\nhost: x\r\ninfer-key: infer-value\r\n"
        f"content-length: {len(raw)}\r\nconnection: close\r\n\r\n").encode() + raw)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"parameter keys starting with 'triton_' are reserved for Triton usage" in answer
    with _grpc(locked) as client, pytest.raises(InferenceServerException,
                                                match="reserved for Triton usage"):
        client.infer("py_params", _params_input(grpcclient),
                     headers={GRPC_PREFIX + "infer-key": "infer-value"},
                     parameters={"triton_other": True})


# -- doors that are shut unless opened ------------------------------------------------------


def test_client_shared_memory_is_off_by_default(locked: ServerProcess) -> None:
    """Triton 2.68's test_client_shm_disabled_by_default, over both ports."""
    http = httpclient.InferenceServerClient(locked.url)
    assert "system_shared_memory" not in http.get_server_metadata(
        headers=INFER_KEY)["extensions"]
    with _grpc(locked) as grpc:
        assert "system_shared_memory" not in grpc.get_server_metadata().extensions
        for client in (http, grpc):
            before = client.get_system_shared_memory_status()
            with pytest.raises(InferenceServerException,
                               match="Client shared memory is disabled") as err:
                client.register_system_shared_memory("dummy", "/dummy_data", 8)
            assert err.value.message() == ("Client shared memory is disabled. Start the server "
                                           "with '--allow-client-shm=true' to enable.")
            with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
                client.unregister_system_shared_memory("dummy")
            with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
                client.unregister_cuda_shared_memory()
            assert client.get_system_shared_memory_status() == before
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as http_err:
        http.register_system_shared_memory("dummy", "/dummy_data", 8)
    assert http_err.value.status() == "501"


def test_model_file_upload_is_off_by_default(locked: ServerProcess) -> None:
    config = json.dumps({"name": "copy", "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
                         "output": [{"name": "PARAMETERS", "data_type": "TYPE_STRING",
                                     "dims": [1]}]})
    code = b"raise SystemExit('never run')\n"
    http = httpclient.InferenceServerClient(locked.url)
    with pytest.raises(InferenceServerException, match="Model file upload is disabled") as err:
        http.load_model("copy", config=config, files={"file:1/model.py": code},
                        headers=ADMIN_KEY)
    assert err.value.status() == "501"
    with _grpc(locked) as grpc, pytest.raises(InferenceServerException,
                                              match="--allow-model-file-upload=true"):
        grpc.load_model("copy", config=config, files={"file:1/model.py": code},
                        headers={GRPC_PREFIX + "admin-key": "admin-value"})
    assert not http.is_model_ready("copy", headers=INFER_KEY)
    # a load without files still works
    http.load_model("add_sub", headers=ADMIN_KEY)
    assert base64  # (the HTTP client base64-encodes the files itself)


def test_chunked_body_capped_at_65536_chunks(locked: ServerProcess) -> None:
    head = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nhost: x\r\ninfer-key: infer-value\r\n"
            b"inference-header-content-length: 0\r\ncontent-type: application/octet-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
    over = _raw_exchange(locked.http_port, head + b"1\r\nA\r\n" * 65537 + b"0\r\n\r\n")
    assert over.startswith(b"HTTP/1.1 400 "), over[:200]
    assert over.endswith(b'{"error":"Chunked request body exceeds maximum of 65536 non-empty '
                         b'chunks. Send fewer or larger HTTP chunks."}')
    # exactly the cap (and empty chunks, which do not count) passes the reader: the request
    # itself is then answered (add_sub wants two inputs)
    at = _raw_exchange(locked.http_port, head + b"1\r\nA\r\n" * 65536 + b"0\r\n\r\n")
    assert at.startswith(b"HTTP/1.1 400 ") and b"non-empty chunks" not in at, at[:300]
    assert httpclient.InferenceServerClient(locked.url).is_server_live()


# -- flags that stop the start-up -----------------------------------------------------------


@pytest.mark.parametrize(("flags", "reason"), [
    (["--http-restricted-api=model-repository,health:k1=v1",
      "--http-restricted-api=metadata,health:k2=v2"],
     "api 'health' can not be specified in multiple config groups"),
    (["--http-restricted-api=model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit'"),
    (["--grpc-restricted-protocol=model-reposit,health:k1=v1"],
     "unknown restricted protocol 'model-reposit'"),
    (["--grpc-restricted-protocol=health:k1"],
     "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. "
     "Got health:k1"),
    (["--http-restricted-api=:k=v"], "--http-restricted-api option format is"),
    (["--http-header-forward-pattern=(["], "is not a valid regular expression"),
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (["--http-ssl-cert=/nowhere.crt"], "--http-ssl-cert and --http-ssl-key go together"),
    (["--grpc-use-ssl=true", "--grpc-server-cert=/nowhere.crt", "--grpc-server-key=/no.key"],
     "cannot read '/nowhere.crt'"),
])
def test_malformed_door_flags_stop_the_start(tmp_path: Path, flags: list[str],
                                             reason: str) -> None:
    done = subprocess.run([sys.executable, "-m", "nursery", "serve", "--model-repository",
                           str(tmp_path), "--http-port=0", "--grpc-port=0",
                           "--allow-metrics=false", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert reason in done.stderr + done.stdout, done.stderr + done.stdout


def test_a_key_that_does_not_fit_its_certificate_stops_the_start(tmp_path: Path,
                                                                 pki: Pki) -> None:
    done = subprocess.run([sys.executable, "-m", "nursery", "serve", "--model-repository",
                           str(tmp_path), "--http-port=0", "--grpc-port=0",
                           "--allow-metrics=false", f"--http-ssl-cert={pki.server.cert}",
                           f"--http-ssl-key={pki.client.key}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "cannot use the certificate" in done.stderr + done.stdout


# -- the card servers -----------------------------------------------------------------------


def test_card_servers_keep_the_doors(pki: Pki, tmp_path: Path) -> None:
    """hypercorn and grpclib (the card-servers extra) with TLS, hypercorn with the HTTP
    restrictions, both with forwarded headers; grpclib refuses restricted groups at start
    rather than leave them open."""
    proc = _start(tmp_path, "--http-server=hypercorn", "--grpc-server=grpclib",
                  "--grpc-use-ssl=true", f"--grpc-server-cert={pki.server.cert}",
                  f"--grpc-server-key={pki.server.key}", f"--http-ssl-cert={pki.server.cert}",
                  f"--http-ssl-key={pki.server.key}",
                  "--http-restricted-api=inference:infer-key=infer-value",
                  "--http-header-forward-pattern=my_header.*",
                  "--grpc-header-forward-pattern=my_header.*",
                  tls=_client_context(pki.ca.path))
    try:
        http = _https(proc, pki)
        with pytest.raises(InferenceServerException, match="This API is restricted") as err:
            http.infer("py_params", _params_input(httpclient))
        assert err.value.status() == "403"
        result = http.infer("py_params", _params_input(httpclient),
                            headers={**INFER_KEY, "my_header_1": "h"})
        assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"my_header_1": "h"}
        http.close()
        with _grpc(proc, ssl=True, root_certificates=str(pki.ca.path)) as grpc:
            result = grpc.infer("py_params", _params_input(grpcclient),
                                headers={"my_header_2": "g"})
            assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"my_header_2": "g"}
    finally:
        _stop(proc)
    done = subprocess.run([sys.executable, "-m", "nursery", "serve", "--model-repository",
                           str(tmp_path), "--grpc-server=grpclib", "--allow-http=false",
                           "--allow-metrics=false", "--grpc-port=0",
                           "--grpc-restricted-protocol=health:k=v"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--grpc-restricted-protocol is served by --grpc-server nursery only" in done.stderr
