"""Client configuration from the environment (docs/contracts.md, shared with the CLI and replay).

- `STRICTQ_URL`: the gateway, e.g. `https://127.0.0.1:8443`;
- `STRICTQ_CA_FILE`: PEM of the CA that signed the gateway's certificate (default: system trust);
- `STRICTQ_API_KEY`: a producer's EmoDB API key (its credential's secret);
- `STRICTQ_WORKER_ID`, `STRICTQ_WORKER_SECRET`: the worker's own credential; the secret is its EmoDB API
  key at the gateway, id:secret its Proxy-Authorization (basic) at the egress proxy;
- `STRICTQ_PROXY_URL`: the egress proxy for outbound calls (unset: calls go straight out); a
  comma-separated list when the proxy runs several processes (`strictq proxy --processes N`): each
  worker uses one, picked by a stable hash of its worker id, so its calls stay on one process;
- `STRICTQ_PROXY_CA_FILE`: PEM of the proxy's CA, trusted for outbound HTTPS (the proxy intercepts TLS);
- `STRICTQ_REGION`: the region this client runs in (e.g. `eu`), sent as `X-Strictq-Region` on every
  gateway request: an edge of a cluster offers a worker the partitions owned in its region first, and one
  started with `--trust-region-header` counts a producer's sends as from there (gateway.client_region).
"""

from __future__ import annotations

import os
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from yarl import URL

from cluster.names import check_node_name

from .errors import ConfigError

ENV_VARS = (
    "STRICTQ_URL",
    "STRICTQ_CA_FILE",
    "STRICTQ_API_KEY",
    "STRICTQ_WORKER_ID",
    "STRICTQ_WORKER_SECRET",
    "STRICTQ_PROXY_URL",
    "STRICTQ_PROXY_CA_FILE",
    "STRICTQ_REGION",
)

__all__ = ["ENV_VARS", "ClientConfig", "ConfigError"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    url: str
    ca_file: str | None = None
    api_key: str | None = field(default=None, repr=False)
    worker_id: str | None = None
    worker_secret: str | None = field(default=None, repr=False)
    proxy_url: str | None = None
    proxy_ca_file: str | None = None
    region: str | None = None  # STRICTQ_REGION: sent as X-Strictq-Region when set

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ClientConfig:
        """Read the STRICTQ_* variables (empty counts as unset); keyword overrides win."""
        source = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = source.get(name, "").strip()
            return value or None

        url = get("STRICTQ_URL")
        if url is None and overrides.get("url") is None:
            raise ConfigError("STRICTQ_URL is not set (the gateway's URL, e.g. https://127.0.0.1:8443)")
        config = cls(
            url=url or "",
            ca_file=get("STRICTQ_CA_FILE"),
            api_key=get("STRICTQ_API_KEY"),
            worker_id=get("STRICTQ_WORKER_ID"),
            worker_secret=get("STRICTQ_WORKER_SECRET"),
            proxy_url=get("STRICTQ_PROXY_URL"),
            proxy_ca_file=get("STRICTQ_PROXY_CA_FILE"),
            region=get("STRICTQ_REGION"),
        )
        return replace(config, **overrides) if overrides else config

    def __post_init__(self) -> None:
        example = "e.g. https://127.0.0.1:8443"
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"STRICTQ_URL must be an http(s) URL ({example}), not {self.url!r}")
        try:
            parsed = URL(self.url)
            valid = bool(parsed.host) and parsed.port is not None
        except ValueError:  # e.g. a port that is not a number
            valid = False
        if not valid or parsed.query_string or parsed.fragment:
            raise ConfigError(f"STRICTQ_URL is not a valid gateway URL ({example}): {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.region is not None and (problem := check_node_name(self.region, "region")):
            raise ConfigError(f"STRICTQ_REGION: {problem}")

    # -- what each role needs -------------------------------------------------------------------------

    def producer_key(self) -> str:
        if not self.api_key:
            raise ConfigError("STRICTQ_API_KEY is not set (the producer's EmoDB API key)")
        return self.api_key

    def worker_key(self) -> str:
        """The worker authenticates its polls with its own credential's secret."""
        if not self.worker_id or not self.worker_secret:
            raise ConfigError(
                "a worker needs STRICTQ_WORKER_ID and STRICTQ_WORKER_SECRET (its own credential)"
            )
        return self.worker_secret

    def proxy_for(self, worker_id: str | None = None) -> str | None:
        """The egress proxy this worker uses: with several (comma-separated), a stable choice by worker id
        (the same worker always lands on the same proxy process, across restarts)."""
        if not self.proxy_url:
            return None
        urls = [u.strip() for u in self.proxy_url.split(",") if u.strip()]
        if len(urls) <= 1:
            return urls[0] if urls else None
        key = (worker_id if worker_id is not None else self.worker_id) or ""
        return urls[zlib.crc32(key.encode()) % len(urls)]

    # -- TLS -----------------------------------------------------------------------------------------

    def gateway_ssl(self) -> ssl.SSLContext | None:
        """Verification context for the gateway: its CA file, or the system trust store. A CA file that
        is missing or not a PEM certificate is a `ConfigError` naming STRICTQ_CA_FILE and the path."""
        if not self.url.startswith("https://"):
            return None
        context = ssl.create_default_context()
        if self.ca_file:
            _load_ca(context, "STRICTQ_CA_FILE", self.ca_file, "the CA that signed the gateway's certificate")
        return context

    def outbound_ssl(self) -> ssl.SSLContext:
        """For outbound HTTPS: the system trust store plus the proxy's CA (it re-signs what it intercepts)."""
        context = ssl.create_default_context()
        if self.proxy_ca_file:
            _load_ca(context, "STRICTQ_PROXY_CA_FILE", self.proxy_ca_file, "the egress proxy's CA")
        return context


def _load_ca(context: ssl.SSLContext, setting: str, path: str, what: str) -> None:
    """Trust the CA in `path`, or say which setting names a file that is not one."""
    where = Path(path).resolve()
    try:
        context.load_verify_locations(cafile=path)
    except FileNotFoundError:
        raise ConfigError(f"{setting}={path}: no such file ({where}; it should hold {what})") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{setting}={path}: not a PEM certificate file ({where}: {exc})") from None
