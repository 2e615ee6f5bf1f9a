"""The internal API's credential: one shared secret per deployment, checked on every internal request.

Why: a queue server's internal port serves every tenant's queues with no per-caller credential (list,
peek bodies, send, claim, delete, purge, moves): anyone who can open a connection to it could use them.
Its callers are few and all ours (the gateways, a cluster's edges, the CLI and tools given
STRICTQ_QUEUE_URL), so they share one secret, sent in the `X-Strictq-Internal` header on every request and
compared in constant time (`hmac.compare_digest`) by one middleware, first in the app, before any handler
reads the request: a request without it gets 401, with another 403, and changes nothing.

Not checked (their answers reveal nothing a caller could use, and probes and load balancers carry no
secret): paths no route serves (404/405), `/healthz` (`{"status": "ok"}`) and `/readyz` (`{"ready": ...}`),
unless they carry a wrong secret: then 403 there too, so a gateway's readiness probe tells an operator at
once that its secret is not the server's. Nor the routes that authenticate each caller with the key file
and its tenant scopes (`/admin/...`, `/metrics`): operators, Prometheus and the egress proxy hold API
keys, not the deployment's secret, which would give them every tenant's data.

The secret lives in a file, 0600 (`--internal-secret FILE` or STRICTQ_INTERNAL_SECRET_FILE):
`strictq queue-server` writes <data-dir>/internal.secret when given none, `strictq cluster up` writes
DIR/internal.secret once for its nodes and edges. A file other users may read is refused at start: the
secret opens every tenant's queues. It travels in clear over plain HTTP: beyond loopback, put TLS on the
internal port (docs/cluster.md, "Internal traffic").
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from protocol.errors import Forbidden, Unauthorized, error_body
from protocol.headers import INTERNAL_SECRET as HEADER
from wirelog.files import StartupError, write_private

from .http_errors import json_response
from .operations import HEALTHZ, READYZ

log = logging.getLogger("strictq.internal_auth")

ENV = "STRICTQ_INTERNAL_SECRET_FILE"
FLAG = "--internal-secret"
FILE_NAME = "internal.secret"  # in a queue server's data dir, and in the data dir of `strictq cluster up`
OPEN_PATHS = frozenset({HEALTHZ.path, READYZ.path})  # their operations (queue_core.operations)
KEYED_PREFIXES = ("/admin/", "/metrics")  # authenticated per caller by the key file (access.keys)
SECRET_RE = re.compile(r"[!-~]{16,512}")  # printable ASCII, no spaces: a header value as it is
REFUSAL_LOG_EVERY = 60.0  # seconds between two WARNING lines about refused requests
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InternalSecret:
    """The secret of one file; never in repr() or logs (only its path is)."""

    __slots__ = ("_raw", "path", "value")

    def __init__(self, value: str, path: Path | None = None) -> None:
        self.value = value
        self._raw = value.encode()
        self.path = path

    def __repr__(self) -> str:
        return f"InternalSecret(path={self.path})"

    @property
    def headers(self) -> dict[str, str]:
        """The header a client session sends on every request (its default headers)."""
        return {HEADER: self.value}

    def matches(self, given: str) -> bool:
        """Constant-time comparison (never `==`: its time would tell how much of a guess was right)."""
        return hmac.compare_digest(given.encode(errors="surrogateescape"), self._raw)

    @classmethod
    def load(cls, path: Path | str) -> InternalSecret:
        """The secret in `path`; StartupError naming the file when it is missing, open to other users
        (any group/other bit), or not a secret."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StartupError(
                path,
                "is missing (the internal secret)",
                f"give the file the queue server wrote (its <data-dir>/{FILE_NAME}; `strictq cluster up`: "
                f"DIR/{FILE_NAME}) with {FLAG} or {ENV}",
            ) from None
        except OSError as exc:
            raise StartupError(
                path,
                f"cannot read the internal secret ({exc.strerror or exc})",
                "make it readable by this user",
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StartupError(path, "is not a file (the internal secret)", f"give {FLAG} a file")
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077:
                who = "other users" if mode & 0o007 else "the group"
                raise StartupError(
                    path,
                    f"the internal secret is mode {mode:04o}, open to {who} (it opens every tenant's queues)",
                    f"run: chmod 600 {path}",
                )
            try:
                raw = os.read(fd, 4096)
            except OSError as exc:
                raise StartupError(
                    path, f"cannot read the internal secret ({exc.strerror or exc})", "check the file"
                ) from None
        finally:
            os.close(fd)
        value = raw.decode(errors="replace").strip()
        if not SECRET_RE.fullmatch(value):
            raise StartupError(
                path,
                "is not an internal secret (one line of 16-512 printable ASCII characters, no spaces)",
                f"remove it to have `strictq queue-server` write a new one, or write one: "
                f"python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > {path}",
            )
        return cls(value, path)

    @classmethod
    def ensure(cls, path: Path) -> tuple[InternalSecret, bool]:
        """The secret in `path`, created first (0600 from its creation) when missing; True if created."""
        if path.exists() or path.is_symlink():
            return cls.load(path), False
        write_private(path, secrets.token_urlsafe(32) + "\n")
        return cls.load(path), True


def secret_file(flag: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the secret is: `--internal-secret FILE`, else $STRICTQ_INTERNAL_SECRET_FILE, else None."""
    if flag is not None:
        return flag
    value = (os.environ if environ is None else environ).get(ENV, "")
    return Path(value) if value else None


def load_secret(flag: Path | None, environ: Mapping[str, str] | None = None) -> InternalSecret | None:
    """The secret named by the flag or the environment (StartupError for an unusable file), or None."""
    path = secret_file(flag, environ)
    return None if path is None else InternalSecret.load(path)


def missing_secret_line(what: str, where: str) -> str:
    """The one start-up line of a client (a gateway) given no secret: the flag, the variable, the file."""
    return (
        f"{what} needs the queue servers' internal secret: give {FLAG} FILE or set {ENV} to {where} "
        '(docs/cluster.md, "Internal traffic")'
    )


def internal_auth(secret: InternalSecret) -> Middleware:
    """The middleware (first in the app): refuse an internal request without the secret or with another."""
    logged = [-REFUSAL_LOG_EVERY]

    def refuse(request: web.Request, error: Unauthorized | Forbidden) -> web.Response:
        now = time.monotonic()
        if now - logged[0] >= REFUSAL_LOG_EVERY:  # never the header's value, only who and what
            logged[0] = now
            log.warning(
                "refused %s %s from %s: %s (further refusals within %.0f s not logged)",
                request.method,
                request.path,
                request.remote,
                error.code,
                REFUSAL_LOG_EVERY,
            )
        return json_response(error_body(error.code, error.message), error.status)

    @web.middleware
    async def check_internal_secret(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = route_of(request)  # the matched route's template, not the raw path (no `..` games)
        if route is None or route.startswith(KEYED_PREFIXES):
            return await handler(request)  # no route (404/405: which exist is no secret), or keyed ones
        given = request.headers.get(HEADER)
        if given is None:
            if route in OPEN_PATHS:
                return await handler(request)
            return refuse(
                request,
                Unauthorized(
                    f"this is a queue server's internal API: every request needs the {HEADER} header with "
                    f"the deployment's internal secret (the file of {FLAG} / {ENV})"
                ),
            )
        if secret.matches(given):
            return await handler(request)
        return refuse(request, Forbidden(f"the {HEADER} header is not this queue server's internal secret"))

    return check_internal_secret


def route_of(request: web.Request) -> str | None:
    """The template of the route that serves `request` (`/v1/queues/{queue}`); None when none does: the
    404 or 405 answer changes nothing and tells only what the source code does (and a CLI pointed at
    the wrong server still hears which variable to set)."""
    resource = request.match_info.route.resource
    return None if resource is None else resource.canonical
