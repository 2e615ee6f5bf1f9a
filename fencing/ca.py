"""The proxy's certificate authority: mitmproxy's own CA files, kept in `<data-dir>/ca` (mitmproxy's
`confdir`) instead of `~/.mitmproxy`, so each deployment has its own CA and the SDK can be pointed at it
(`STRICTQ_PROXY_CA_FILE`), and the trust bundle for upstream verification (system roots plus private CAs).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

CONF_BASENAME = "mitmproxy"  # mitmproxy.options.CONF_BASENAME: TlsConfig loads `<confdir>/mitmproxy-ca.pem`
KEY_SIZE = 2048


def confdir(data_dir: Path) -> Path:
    return data_dir / "ca"


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

        CertStore.create_store(
            confdir(data_dir), CONF_BASENAME, KEY_SIZE, organization="strictq", cn="strictq proxy CA"
        )
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
    tmp = bundle.with_name(f".{bundle.name}.{os.getpid()}")
    tmp.write_bytes(b"\n".join(parts))
    os.replace(tmp, bundle)  # several processes may write it at once: each rename is whole
    return bundle.resolve()
