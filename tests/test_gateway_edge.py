"""The edge around the faces: key file, local CA, tenant namespaces and `strictq serve` start-up."""

from __future__ import annotations

import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from kit.process import CLIENT_ENV, LISTENING, ChildProcess, launch, strictq

from access.keys import Credential, KeyFileError, KeyRing, write_development_keys
from access.permissions import visible_names
from gateway.tls import ensure_local_certificates, server_context
from queue_core.machine import QueueNotFound
from queue_core.scope import internal_name


# ------------------------------------------------------------------------------------------ key file
def test_development_keys_round_trip_and_stay_private(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    written = write_development_keys(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = KeyRing.load(path)
    roles = sorted(c.role for c in loaded.credentials)
    assert roles == ["admin", "producer", "proxy", "worker", "worker", "worker"]
    for credential in written.credentials:
        assert loaded.by_secret(credential.secret) == credential
        assert loaded.by_id(credential.id) == credential
    assert loaded.by_secret("not-a-secret-at-all") is None


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("not toml [", "not valid TOML"),
        ("# nothing here\n", "no \\[\\[credential"),
        ('[[credential]]\nid = "a"\nsecret = "0123456789abcdef"\nrole = "admin"\ntenant = "t"\n', "id must"),
        ('[[credential]]\nid = "abcd"\nsecret = "short"\nrole = "admin"\ntenant = "t"\n', "secret must"),
        ('[[credential]]\nid = "abcd"\nsecret = "0123456789abcdef"\nrole = "root"\ntenant = "t"\n', "role"),
        (
            '[[credential]]\nid = "abcd"\nsecret = "0123456789abcdef"\nrole = "admin"\ntenant = "T.1"\n',
            "tenant",
        ),
        (
            '[[credential]]\nid = "abcd"\nsecret = "0123456789abcdef"\nrole = "admin"\ntenant = "t"\n'
            '[[credential]]\nid = "abcd"\nsecret = "fedcba9876543210"\nrole = "admin"\ntenant = "t"\n',
            "ids must be unique",
        ),
    ],
)
def test_bad_key_files_are_refused_with_the_reason(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(KeyFileError, match=fragment):
        KeyRing.load(path)


# --------------------------------------------------------------------------------------- namespaces
def test_tenants_and_prefixes_hide_other_queues() -> None:
    limited = Credential("lim1", "0123456789abcdef", "admin", "acme", ("orders",))
    other = Credential("oth1", "fedcba9876543210", "admin", "globex")
    assert internal_name(limited, "orders-eu") == "acme.orders-eu"
    with pytest.raises(QueueNotFound):
        internal_name(limited, "payments")  # outside its prefixes: reported as missing
    with pytest.raises(QueueNotFound):
        internal_name(limited, "bad/name")
    names = ["acme.orders-eu", "acme.payments", "globex.orders-eu"]
    assert visible_names(limited, names) == ["orders-eu"]
    assert visible_names(other, names) == ["orders-eu"]
    assert visible_names(other, names, prefix="x") == []


# --------------------------------------------------------------------------------------------- TLS
def test_local_ca_signs_a_certificate_for_loopback_names(tmp_path: Path) -> None:
    files = ensure_local_certificates(tmp_path / "tls")
    assert files.ca is not None
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    # A second start reuses the same files instead of minting a new CA.
    again = ensure_local_certificates(tmp_path / "tls")
    assert again.ca is not None and again.ca.read_bytes() == files.ca.read_bytes()
    assert again.cert.read_bytes() == files.cert.read_bytes()
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    server_context(files)  # loads the chain


# ----------------------------------------------------------------------------------- strictq serve
def _start_serve(data_dir: Path) -> tuple[ChildProcess, list[str]]:
    """`strictq serve` up to its last start-up line; the stdout lines read (in order) with it."""
    proc = launch(
        strictq("serve", "--port", "0", "--data-dir", str(data_dir)),
        data_dir.parent / "serve.log",
        wait_for=(CLIENT_ENV,),
    )
    return proc, proc.lines


def test_serve_follows_the_start_up_contract(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc, lines = _start_serve(data_dir)
    try:
        assert lines[0].startswith("strictq: listening on https://127.0.0.1:"), lines
        url = lines[0].split()[-1]
        assert lines[1] == f"strictq: ca {(data_dir / 'tls' / 'ca.pem').resolve()}"
        assert lines[2] == f"strictq: keys {(data_dir / 'keys.toml').resolve()}"
        # the egress proxy, a child process following this gateway's control stream
        assert lines[3].startswith("strictq: proxy on http://127.0.0.1:"), lines
        proxy_ca = (data_dir / "proxy" / "ca" / "mitmproxy-ca-cert.pem").resolve()
        assert lines[4] == f"strictq: proxy ca {proxy_ca}"
        assert lines[5] == f"strictq: client env {(data_dir / 'client.env').resolve()}"
        context = ssl.create_default_context(cafile=str(data_dir / "tls" / "ca.pem"))
        for path in ("/healthz", "/readyz"):
            with urllib.request.urlopen(url + path, context=context, timeout=10) as response:
                assert response.status == 200
        with pytest.raises(urllib.error.URLError):  # an unknown CA is refused: it is real TLS
            urllib.request.urlopen(url + "/healthz", context=ssl.create_default_context(), timeout=10)
        env = dict(
            line.split("=", 1)
            for line in (data_dir / "client.env").read_text().splitlines()
            if line and not line.startswith("#")
        )
        keys = KeyRing.load(data_dir / "keys.toml")
        assert env["STRICTQ_URL"] == url
        assert env["STRICTQ_PROXY_URL"] == lines[3].split()[-1]
        assert env["STRICTQ_PROXY_CA_FILE"] == str(proxy_ca)
        producer = keys.by_secret(env["STRICTQ_API_KEY"])
        worker = keys.by_id(env["STRICTQ_WORKER_ID"])
        assert producer is not None and producer.role == "producer"
        assert (
            worker is not None and worker.role == "worker" and worker.secret == env["STRICTQ_WORKER_SECRET"]
        )
    finally:
        assert proc.terminate(timeout=15) == 0
    # A restart keeps the CA and the credentials.
    ca_before = (data_dir / "tls" / "ca.pem").read_bytes()
    keys_before = (data_dir / "keys.toml").read_text()
    proc, lines = _start_serve(data_dir)
    try:
        assert lines[0].startswith("strictq: listening on https://")
        assert (data_dir / "tls" / "ca.pem").read_bytes() == ca_before
        assert (data_dir / "keys.toml").read_text() == keys_before
    finally:
        assert proc.terminate(timeout=15) == 0


def test_serve_refuses_a_broken_key_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text("[[credential]]\nid = 1\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "strictq",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--keys",
            str(keys),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "credential #1" in result.stderr and "Traceback" not in result.stderr


def test_serve_can_require_client_certificates(tmp_path: Path) -> None:
    """--client-ca: a worker without a certificate from that CA is refused during the TLS handshake."""
    import trustme

    client_ca = trustme.CA()
    client_ca_file = tmp_path / "client-ca.pem"
    client_ca.cert_pem.write_to_path(str(client_ca_file))
    data_dir = tmp_path / "data"
    proc = launch(
        strictq("serve", "--port", "0", "--data-dir", str(data_dir), "--client-ca", str(client_ca_file)),
        tmp_path / "serve.log",
    )
    try:
        url = proc.startup[LISTENING]
        server_ca = str(data_dir / "tls" / "ca.pem")
        without = ssl.create_default_context(cafile=server_ca)
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(url + "/healthz", context=without, timeout=10)
        with_cert = ssl.create_default_context(cafile=server_ca)
        client_ca.issue_cert("worker-1").configure_cert(with_cert)
        with urllib.request.urlopen(url + "/healthz", context=with_cert, timeout=10) as response:
            assert response.status == 200
    finally:
        assert proc.terminate(timeout=15) == 0

