"""TLS for the edge: a local CA and a server certificate made with `cryptography` on first start.

Real deployments pass `--tls-cert/--tls-key`; the local CA exists so that development and tests get real
TLS (verified by clients that trust `ca.pem`) without any manual step.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from wirelog.files import PUBLIC_FILE, StartupError, private_dir, write_file, write_private

CA_DAYS = 3650
SERVER_DAYS = 825


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None  # the local CA that signed `cert`, when we made it


def ensure_local_certificates(directory: Path) -> TlsFiles:
    """Create (once) a CA and a server certificate naming 127.0.0.1, ::1, localhost and this host.

    Private keys are 0600 from their creation, certificates 0644, in a 0700 directory (wirelog.files)."""
    private_dir(directory)
    ca_cert_path, ca_key_path = directory / "ca.pem", directory / "ca-key.pem"
    cert_path, key_path = directory / "server.pem", directory / "server-key.pem"
    if not (ca_cert_path.exists() and ca_key_path.exists()):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key)
        _write_key(ca_key_path, ca_key)
        write_file(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM), PUBLIC_FILE)
        cert_path.unlink(missing_ok=True)
    if not (cert_path.exists() and key_path.exists()):
        try:
            ca_key_loaded = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
            ca_cert_loaded = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        except ValueError as exc:
            raise StartupError(
                ca_key_path,
                f"the local CA cannot be loaded ({exc})",
                f"restore {ca_key_path.name} and {ca_cert_path.name} from a backup, or remove both to make "
                "a new CA (clients must then trust the new ca.pem)",
            ) from None
        if not isinstance(ca_key_loaded, ec.EllipticCurvePrivateKey):
            raise StartupError(
                ca_key_path, "not an EC private key", "remove it and ca.pem to make a new local CA"
            )
        server_key = ec.generate_private_key(ec.SECP256R1())
        server_cert = _server_certificate(server_key, ca_key_loaded, ca_cert_loaded)
        _write_key(key_path, server_key)
        write_file(cert_path, server_cert.public_bytes(serialization.Encoding.PEM), PUBLIC_FILE)
    return TlsFiles(cert_path, key_path, ca_cert_path)


def server_context(files: TlsFiles, client_ca: Path | None = None) -> ssl.SSLContext:
    """Server-side context; with `client_ca`, clients must present a certificate it signed. A key or
    certificate that cannot be read or does not match raises StartupError naming it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for path in (files.cert, files.key):
        try:
            path.open("rb").close()
        except OSError as exc:
            raise StartupError(
                path, f"cannot read it ({exc.strerror or exc})", "make it readable by this user"
            ) from None
    try:
        context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(
            files.key,
            f"cannot load the key with the certificate {files.cert} ({exc})",
            "give a PEM certificate chain and its unencrypted PEM private key (--tls-cert/--tls-key)",
        ) from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise StartupError(
                client_ca, f"cannot load the client CA ({exc})", "give a readable PEM CA file (--client-ca)"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """0600 from its creation (never chmod after the key is in the file)."""
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "strictq local CA")])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _server_certificate(
    key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
) -> x509.Certificate:
    hostname = socket.gethostname()
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    if hostname and hostname != "localhost":
        names.append(x509.DNSName(hostname))
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "strictq gateway")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
