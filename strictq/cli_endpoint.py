"""Where the `strictq` client and admin commands connect, and how a failed connection reads: one line
naming the setting to change, never a traceback.

Two servers speak to the CLI:
- `strictq serve` (the gateway, HTTPS): `STRICTQ_URL`, the variable its `<data-dir>/client.env` sets (the
  SDK reads the same one). This is the default.
- `strictq queue-server` (the queue core's internal API, plain HTTP on loopback): `STRICTQ_QUEUE_URL` or a
  command's `--queue-server URL`. When one is given, the commands speak the internal API instead.

A server's refusal reads the same for every command (`EdgeError`, built by `refusal` from the one error
body shape of protocol.errors): `strictq: <status> <code>: <message>`, exit 1.

Cheap to import (stdlib and protocol only): `strictq --help` builds every parser; aiohttp is imported where
it is used.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from protocol.errors import HTTP_ERROR, parse_error

GATEWAY_ENV = "STRICTQ_URL"
QUEUE_SERVER_ENV = "STRICTQ_QUEUE_URL"
CA_ENV = "STRICTQ_CA_FILE"
DEFAULT_GATEWAY = "https://127.0.0.1:8443"  # `make run`
CLIENT_ENV_PATH = "var/strictq/client.env"  # `make run`'s data dir; `strictq serve` prints its own path
LOAD_HINT = f"set -a; . {CLIENT_ENV_PATH}; set +a  (the 'strictq: client env' path `strictq serve` printed)"
CA_HINT = "<data-dir>/tls/ca.pem of `strictq serve` (make run: var/strictq/tls/ca.pem)"


class CliError(Exception):
    """A failure the user can fix: one line on stderr (`strictq: <message>`) and the exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class EdgeError(CliError):
    """A server refused a call: `strictq: <status> <code>: <message>` (exit 1); `body` is its answer."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        self.message = " ".join(message.split())  # one line, whatever the server put in it
        super().__init__(f"{status} {code}: {self.message}", 1)
        self.status = status
        self.code = code
        self.body = body


def refusal(
    status: int, body: Any, *, default_code: str = HTTP_ERROR, fallback: str | None = None
) -> EdgeError:
    """The one line for a 4xx/5xx answer: the code and message of its error body (`{"error": {...}}`, or an
    older server's flat one), else `default_code` and `fallback` (None: the status's reason phrase)."""
    error = parse_error(body, default_code=default_code)
    if fallback is None:
        try:
            fallback = HTTPStatus(status).phrase
        except ValueError:  # a status no RFC names
            fallback = ""
    return EdgeError(status, error.code, error.message or fallback, body)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One server the CLI talks to: its URL, the setting that named it, and the CA to trust for HTTPS."""

    url: str
    source: str  # the variable or flag that gave the URL (named in every error)
    internal: bool  # the queue server's internal API (else the gateway of `strictq serve`)
    ca_file: str | None = None

    @property
    def https(self) -> bool:
        return self.url.startswith("https://")


def endpoint(queue_server: str | None = None, environ: Mapping[str, str] | None = None) -> Endpoint:
    """`--queue-server URL`, else STRICTQ_QUEUE_URL: the internal API; else STRICTQ_URL: the gateway.
    CliError (exit 2) when the URL is not an http(s) URL with a host."""
    env = os.environ if environ is None else environ
    ca_file = env.get(CA_ENV) or None
    if queue_server:
        found = Endpoint(queue_server.rstrip("/"), "--queue-server", True, ca_file)
    elif env.get(QUEUE_SERVER_ENV):
        found = Endpoint(env[QUEUE_SERVER_ENV].rstrip("/"), QUEUE_SERVER_ENV, True, ca_file)
    else:
        found = Endpoint(env.get(GATEWAY_ENV, "").rstrip("/") or DEFAULT_GATEWAY, GATEWAY_ENV, False, ca_file)
    check_url(found)
    return found


def check_url(found: Endpoint) -> None:
    try:
        parts = urlsplit(found.url)
        port = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise CliError(f"{found.source}={found.url!r} is not a valid URL ({exc})", 2) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(
            f"{found.source}={found.url!r} is not an http:// or https:// URL (e.g. {DEFAULT_GATEWAY})", 2
        )
    del port


def ssl_context(found: Endpoint) -> ssl.SSLContext | bool:
    """Trust STRICTQ_CA_FILE for HTTPS (default: the system's CAs); CliError (exit 2) naming the variable
    when the file is missing or is not a PEM certificate."""
    if not found.ca_file:
        return True
    path = Path(found.ca_file)
    if not path.is_file():
        what = "a directory, not a file" if path.is_dir() else "no such file"
        raise CliError(
            f"{CA_ENV}={found.ca_file}: {what}; it should be the CA that signed the server's "
            f"certificate: {CA_HINT}",
            2,
        )
    try:
        return ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise CliError(f"{CA_ENV}={found.ca_file}: not a PEM CA certificate ({exc})", 2) from None


def where(found: Endpoint) -> str:
    """What to run or set when nothing answers at the endpoint."""
    if found.internal:
        return f"is `strictq queue-server` running there? Set {found.source} to its URL."
    return (
        f"is `strictq serve` (make run) running? Set {GATEWAY_ENV} to its URL, e.g. by loading its client "
        f"settings: {LOAD_HINT}"
    )


async def explain(exc: BaseException, found: Endpoint) -> str:
    """One line for a request that got no HTTP answer: refused, TLS, plain HTTP on a TLS port, timeout."""
    import aiohttp

    reason = " ".join((str(exc) or type(exc).__name__).split())
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        trust = (
            f"{CA_ENV}={found.ca_file} did not sign it"
            if found.ca_file
            else f"{CA_ENV} is not set, so only the system's CAs are trusted"
        )
        return (
            f"{found.url}: the server's certificate is not trusted ({trust}); set {CA_ENV} to {CA_HINT}, "
            f"or load the client settings: {LOAD_HINT}"
        )
    if isinstance(exc, aiohttp.ClientSSLError) and found.https and _plain_http(reason):
        plain = "http://" + found.url.removeprefix("https://")
        return f"{found.url} answers plain HTTP, not TLS: use {plain} ({found.source})"
    if (
        not found.https
        and isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
        and await _speaks_tls(found.url)
    ):
        secure = "https://" + found.url.removeprefix("http://")
        trust = "" if found.ca_file else f" and set {CA_ENV} to {CA_HINT}"
        return f"{found.url} speaks HTTPS: use {secure} ({found.source}){trust}"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return f"{found.url} did not answer in time; {where(found)}"
    if isinstance(exc, aiohttp.InvalidURL):
        return f"{found.source}={found.url!r} is not a valid URL ({reason})"
    return f"cannot reach {found.url} ({reason}); {where(found)}"


def _plain_http(reason: str) -> bool:
    """OpenSSL's words for a TLS client that got a plain-HTTP answer."""
    lowered = reason.lower()
    return any(words in lowered for words in ("wrong version number", "record layer failure", "http request"))


async def _speaks_tls(url: str) -> bool:
    """Whether the server at `url` completes a TLS handshake (certificate not checked): then `http://`
    was the wrong scheme."""
    import asyncio

    parts = urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(3):
            _, writer = await asyncio.open_connection(
                parts.hostname, parts.port or 80, ssl=context, server_hostname=parts.hostname
            )
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass
    return True
