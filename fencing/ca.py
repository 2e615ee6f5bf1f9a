"""The proxy's certificate authority: mitmproxy's own CA files, kept in `<data-dir>/ca` (mitmproxy's
`confdir`) instead of `~/.mitmproxy`, so each deployment has its own CA and the SDK can be pointed at it
(`STRICTQ_PROXY_CA_FILE`), and the trust bundle for upstream verification (system roots plus private CAs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from wirelog.files import PUBLIC_FILE, private_dir, write_file

CONF_BASENAME = "mitmproxy"  # mitmproxy.options.CONF_BASENAME: TlsConfig loads `<confdir>/mitmproxy-ca.pem`
KEY_SIZE = 2048
PUBLIC_NAMES = ("ca-cert.pem", "ca-cert.cer", "ca-cert.p12", "dhparam.pem")  # the rest holds the key: 0600


SERVE_PROXY_DIR = "proxy"  # `strictq serve`'s proxy child keeps its state in <serve data dir>/proxy


def confdir(data_dir: Path) -> Path:
    return data_dir / "ca"


def serve_proxy_dir(serve_data_dir: Path) -> Path:
    """The data dir of the proxy `strictq serve --data-dir DIR` runs as its child."""
    return serve_data_dir / SERVE_PROXY_DIR


def ca_cert_path(data_dir: Path) -> Path:
    """The CA certificate (public part only) that workers trust."""
    return confdir(data_dir) / f"{CONF_BASENAME}-ca-cert.pem"


def ensure_ca(data_dir: Path) -> Path:
    """Create the CA on first use (mitmproxy's own generator, same files it would write) and return the
    certificate's path. Call it in the parent before starting several proxy processes: two processes
    creating the CA at once would each write their own."""
    cert = ca_cert_path(data_dir)
    if not (confdir(data_dir) / f"{CONF_BASENAME}-ca.pem").exists():
        from mitmproxy.certs import CertStore

        # 0700 before mitmproxy writes into it (it writes the private key under a 0077 umask itself).
        private_dir(confdir(private_dir(data_dir)))

        CertStore.create_store(
            confdir(data_dir), CONF_BASENAME, KEY_SIZE, organization="strictq", cn="strictq proxy CA"
        )
        # mitmproxy writes the public files under the process's umask (0666 under umask 0): certificates
        # are public, but nobody else may change them. At most 0644 (the umask can only tighten it).
        for name in PUBLIC_NAMES:
            path = confdir(data_dir) / f"{CONF_BASENAME}-{name}"
            if path.exists():
                path.chmod(path.stat().st_mode & PUBLIC_FILE)
    return cert.resolve()


def write_upstream_trust(data_dir: Path, extra_cas: Sequence[Path]) -> Path | None:
    """mitmproxy verifies upstream certificates against one PEM file (`ssl_verify_upstream_trusted_ca`),
    which replaces its default (certifi). With private CAs, write certifi's roots plus them into one
    bundle; without, return None (mitmproxy uses certifi)."""
    if not extra_cas:
        return None
    import certifi

    parts = [Path(certifi.where()).read_bytes()]
    for path in extra_cas:
        parts.append(Path(path).read_bytes())
    bundle = data_dir / "upstream-trust.pem"
    # Public roots; several processes may write it at once: each writes aside and renames, whole.
    write_file(bundle, b"\n".join(parts), PUBLIC_FILE)
    return bundle.resolve()
