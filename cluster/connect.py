"""Connecting to the JetStream servers: one way, with options right for a replicated queue.

Why one place: every piece of the cluster (queue servers, the master, the gateway, `strictq cluster status`)
must survive a nats-server dying under it. The client reconnects forever with short waits (a partition's
owner must not give up on the stream while a majority still stands), notices a dead server by pings within
seconds, buffers a whole frame (8 MB) while it reconnects, and logs each disconnect or error as one WARNING
line that never carries the password. The first connection, in contrast, is bounded: a wrong address or
password is an error for the operator, not an endless retry.

The credentials live in `<data-dir>/nats/credentials` (0600, JSON, written by `cluster.nats_servers`);
`--cluster` options take `nats://h1:4222,nats://h2:4222` with that file, or `nats://user:pass@host:port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nats
import nats.errors
from nats.aio.client import Client

from wirelog.files import StartupError

log = logging.getLogger("strictq.cluster.nats")

CREDENTIALS_FILE = Path("nats") / "credentials"  # under the data dir of `strictq cluster up`
GATEWAY_CREDENTIALS_FILE = Path("nats") / "gateway.credentials"  # the edges' restricted login (nats_roles)
SYSTEM_CREDENTIALS_FILE = Path("nats") / "system.credentials"  # the system account's (nats_system)
DEFAULT_PORT = 4222
SCHEMES = ("nats", "tls")

RECONNECT_WAIT = 0.2  # seconds between attempts on one server: a failover is a few seconds, not minutes
CONNECT_TIMEOUT = 2  # one TCP + INFO/CONNECT exchange (nats-py's unit: whole seconds)
FIRST_CONNECT_WITHIN = 10.0  # the first connection to any of the servers, in all
PING_INTERVAL = 2  # a silent (stopped, partitioned) server is noticed after ~2 unanswered pings
MAX_OUTSTANDING_PINGS = 2
PENDING_SIZE = 16 * 1024 * 1024  # bytes buffered while reconnecting: a full 8 MB frame fits
REPEAT_AFTER = 5.0  # the same warning line is logged at most once per this many seconds


class NatsUnavailable(ConnectionError):
    """No JetStream server could be reached (or it refused the credentials) within the bound."""


class NatsUrlError(ValueError):
    """A `--cluster` value that is not a list of nats:// URLs; the message is one line for the operator."""


# ------------------------------------------------------------------------------------- credentials
def credentials_path(data_dir: Path | str) -> Path:
    """Where `strictq cluster up` keeps the JetStream user and password for a data dir."""
    return Path(data_dir) / CREDENTIALS_FILE


def read_credentials(path: Path | str) -> tuple[str, str]:
    """(user, password) from a credentials file; a StartupError naming the file if it is unusable."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StartupError(
            path,
            "is missing (the JetStream credentials)",
            "start the JetStream servers first (`strictq cluster up --data-dir DIR`) or give the user and "
            "password in the URL (nats://user:password@host:port)",
        ) from None
    except OSError as exc:
        raise StartupError(
            path,
            f"cannot read it ({exc.strerror or exc})",
            "check that this user can read it (it is meant to be 0600, owned by the cluster's user)",
        ) from None
    try:
        data = json.loads(raw)
        user, password = data["user"], data["password"]
    except (ValueError, TypeError, KeyError):
        raise StartupError(
            path,
            "is not a JetStream credentials file (JSON with `user` and `password`)",
            "restore it from the data dir of `strictq cluster up`, or give nats://user:password@host:port",
        ) from None
    if not isinstance(user, str) or not isinstance(password, str) or not user or not password:
        raise StartupError(path, "has an empty or non-text `user` or `password`", "restore it")
    return user, password


def gateway_credentials_path(data_dir: Path | str) -> Path:
    """Where `strictq cluster up` keeps the edges' (gateway role's) JetStream login for a data dir."""
    return Path(data_dir) / GATEWAY_CREDENTIALS_FILE


def system_credentials_path(data_dir: Path | str) -> Path:
    """Where `strictq cluster up` keeps the system account's login (servers' health and JetStream state,
    asked over NATS instead of an HTTP monitoring port without a login) for a data dir."""
    return Path(data_dir) / SYSTEM_CREDENTIALS_FILE


def read_cluster_id(path: Path | str) -> str | None:
    """The cluster id a credentials file names (`cluster`, written with the role logins), if any."""
    try:
        value = json.loads(Path(path).read_bytes()).get("cluster")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def credentials_from(data_dir: Path | str) -> tuple[str, str]:
    """(user, password) of the JetStream servers `strictq cluster up` started in `data_dir`."""
    return read_credentials(credentials_path(data_dir))


@dataclass(frozen=True)
class NatsSettings:
    """Where the JetStream servers are and how to log in: what a `--cluster` option resolves to.

    `urls` never carry credentials (they are logged); the password is kept out of repr()."""

    urls: tuple[str, ...]
    user: str
    password: str = field(repr=False)
    # The id the cluster's layout is created with when a first queue server creates it (the servers'
    # permissions name it: cluster.nats_roles); None: a random one.
    cluster_id: str | None = None

    @classmethod
    def from_url_arg(cls, value: str, credentials_file: Path | None) -> NatsSettings:
        """Parse `nats://h1:4222,nats://h2:4222` (bare `host:port` too); credentials come from
        `nats://user:pass@host:port` in the value, else from `credentials_file`.

        NatsUrlError (a ValueError, one line) for a malformed value; StartupError for an unusable file."""
        urls: list[str] = []
        auth: set[tuple[str, str]] = set()
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            url, userinfo = _parse_url(part)
            urls.append(url)
            if userinfo is not None:
                auth.add(userinfo)
        if not urls:
            raise NatsUrlError("no NATS server given: expected nats://host:port[,nats://host:port...]")
        if len(auth) > 1:
            raise NatsUrlError("the NATS URLs give different users or passwords: give one login for all")
        cluster_id = None
        if auth:
            user, password = auth.pop()
        elif credentials_file is not None:
            user, password = read_credentials(credentials_file)
            cluster_id = read_cluster_id(credentials_file)
        else:
            raise NatsUrlError(
                "no NATS credentials: give nats://user:password@host:port or the cluster's credentials file"
            )
        return cls(tuple(urls), user, password, cluster_id)


def _parse_url(part: str) -> tuple[str, tuple[str, str] | None]:
    """One server URL without credentials, and the (user, password) it carried if any."""
    text = part if "://" in part else f"nats://{part}"
    try:
        split = urlsplit(text)
        port = split.port
        host = split.hostname
        username, password = split.username, split.password
    except ValueError:
        raise NatsUrlError(f"{_shown(part)!r} is not a NATS URL (nats://host:port)") from None
    if split.scheme not in SCHEMES:
        raise NatsUrlError(f"{_shown(part)!r}: the scheme must be nats:// or tls://")
    if not host or split.path not in ("", "/") or split.query or split.fragment:
        raise NatsUrlError(f"{_shown(part)!r} is not a NATS URL (nats://host:port)")
    netloc = f"[{host}]" if ":" in host else host
    url = f"{split.scheme}://{netloc}:{port or DEFAULT_PORT}"
    if username is None and password is None:
        return url, None
    if not username or not password:
        raise NatsUrlError(f"{_shown(part)!r}: give both the user and the password (nats://user:pass@host)")
    return url, (unquote(username), unquote(password))


def _shown(url: str) -> str:
    """A URL as it may be printed: any user:password@ replaced."""
    scheme, sep, rest = url.rpartition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return f"{scheme}{sep}{rest}"


# -------------------------------------------------------------------------------------- connecting
class _Callbacks:
    """nats-py's callbacks: one WARNING line per event (repeats within REPEAT_AFTER s suppressed), and
    the first connection's fatal error (a refused login) noticed at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.client: Client | None = None
        self.connecting = True
        self.last_error: BaseException | None = None
        self.refused = asyncio.Event()
        self._said: dict[str, float] = {}

    def _warn(self, line: str) -> None:
        now = time.monotonic()
        if now - self._said.get(line, -REPEAT_AFTER) >= REPEAT_AFTER:
            self._said[line] = now
            log.warning("nats %s: %s", self.name, line)

    def _server(self) -> str:
        url = self.client.connected_url if self.client is not None else None
        return f"{url.hostname}:{url.port}" if url is not None else "the server"

    async def error(self, exc: Exception) -> None:
        self.last_error = exc
        if self.connecting and _is_refusal(exc):
            self.refused.set()
        self._warn(f"error: {_describe(exc)}")

    async def disconnected(self) -> None:
        if not self.connecting and self.client is not None and not self.client.is_closed:
            self._warn("disconnected; reconnecting")

    async def reconnected(self) -> None:
        log.info("nats %s: reconnected to %s", self.name, self._server())

    async def closed(self) -> None:
        log.debug("nats %s: connection closed", self.name)


def _is_refusal(exc: BaseException) -> bool:
    """A refused login (nats-py raises a plain Error with the server's text while connecting)."""
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


async def connect(
    urls: Sequence[str],
    user: str,
    password: str,
    *,
    name: str,
    no_echo: bool = True,
    within: float = FIRST_CONNECT_WITHIN,
) -> Client:
    """A connected nats-py client that reconnects forever (every RECONNECT_WAIT s) once connected.

    The first connection must succeed within `within` seconds, else NatsUnavailable (at once if the
    servers refuse the login). `name` shows in the servers' monitoring (/connz). `no_echo`: this
    connection does not receive core-NATS messages it published itself (JetStream deliveries, KV
    watches and request replies are unaffected)."""
    if not urls:
        raise NatsUnavailable("no NATS server URL given")
    servers = list(urls)
    callbacks = _Callbacks(name)
    client = Client()
    callbacks.client = client
    connecting = asyncio.ensure_future(
        client.connect(
            servers=servers,
            name=name,
            user=user,
            password=password,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            # nats-py annotates these seconds as int; it only sleeps on them, so a float is right.
            reconnect_time_wait=RECONNECT_WAIT,  # type: ignore[arg-type]
            connect_timeout=CONNECT_TIMEOUT,
            ping_interval=PING_INTERVAL,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            pending_size=PENDING_SIZE,
            no_echo=no_echo,
            error_cb=callbacks.error,
            disconnected_cb=callbacks.disconnected,
            reconnected_cb=callbacks.reconnected,
            closed_cb=callbacks.closed,
        )
    )
    refused = asyncio.ensure_future(callbacks.refused.wait())
    try:
        await asyncio.wait({connecting, refused}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller gave up (cancelled): no connection attempts left behind
        connecting.cancel()
        raise
    finally:
        refused.cancel()
    if connecting.done() and connecting.exception() is None:
        callbacks.connecting = False
        return client
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    with contextlib.suppress(Exception):
        await client.close()
    shown = ", ".join(_shown(u) for u in servers)
    if callbacks.refused.is_set():
        raise NatsUnavailable(f"NATS at {shown} refused the login of user {user!r}: check the credentials")
    last = callbacks.last_error
    reason = f" (last error: {_describe(last)})" if last is not None else ""
    raise NatsUnavailable(
        f"cannot connect to NATS at {shown} within {within:g}s{reason}: are the JetStream servers "
        "running (`strictq cluster up`)?"
    )
