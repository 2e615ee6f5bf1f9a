"""The operator's dashboard's sessions: a browser logs in once with an admin or operator key and then carries
a cookie instead of the key (browsers cannot send `X-BV-API-Key` on a navigation).

- `SessionStore` keeps sessions in memory only: a random id (32 bytes from `secrets`; the store keys them
  by its SHA-256, so the id itself is not kept), the credential's id (never its secret), a CSRF token, and
  when it was opened and last used. A session ends after `idle` seconds unused, `lifetime` seconds after
  login, at logout, when the key file no longer holds its credential with an allowed role, and when the
  process stops. At most `limit` sessions exist; the least recently used goes first.
- The cookie (`__Host-strictq_dashboard` over TLS, `strictq_dashboard` with `--insecure-http`, where the
  browser would drop a Secure cookie) is HttpOnly, SameSite=Strict, Path=/, Secure over TLS, and has no
  Max-Age: it goes with the browser session, and the server side expires it anyway.
- `session_middleware` lets the dashboard's page call the admin routes (`/admin/...`) with that cookie:
  a request carrying no key but a live session cookie and the session's CSRF token in `X-Strictq-CSRF` is
  authenticated as the session's credential (queue_core.admin_http.AUTHENTICATED), so every route keeps
  its own role and tenant checks. The cookie without the token is refused (403 `csrf_mismatch`): a page of
  another site can make the browser send the cookie (SameSite stops that in today's browsers) but cannot
  read the token from the dashboard's page.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from access.keys import Credential, KeyRing
from access.permissions import READ_ROLES
from protocol import headers
from protocol.errors import Forbidden
from queue_core.admin_http import AUTHENTICATED, error_response

COOKIE = "strictq_dashboard"
# Over TLS the cookie is `__Host-strictq_dashboard`: browsers then take it only with Secure and Path=/ and
# without Domain, so neither plain HTTP nor another host name can set or shadow it.
SECURE_COOKIE = "__Host-" + COOKIE
CSRF_HEADER = "X-Strictq-CSRF"
CSRF_FIELD = "csrf"  # the token's form field (logout)
IDLE = 30 * 60.0
LIFETIME = 8 * 3600.0
LIMIT = 1000
DASHBOARD_ROLES = READ_ROLES  # admin (its tenant) and operator (every tenant)


class CsrfMismatch(Forbidden):
    """A request with the dashboard's session cookie but without its CSRF token (or with another)."""

    code = "csrf_mismatch"


@dataclass(slots=True)
class Session:
    credential_id: str
    csrf: str
    opened: float
    seen: float


class SessionStore:
    def __init__(
        self,
        keys: KeyRing,
        *,
        idle: float = IDLE,
        lifetime: float = LIFETIME,
        limit: int = LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = keys
        self.idle = idle
        self.lifetime = lifetime
        self.limit = limit
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # by the id's digest, oldest use first

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, credential: Credential) -> tuple[str, Session]:
        """A new session for `credential`: (the cookie's value, the session)."""
        now = self.clock()
        self._expire(now)
        while len(self._sessions) >= self.limit:
            self._sessions.popitem(last=False)
        session_id = secrets.token_urlsafe(32)
        session = Session(credential.id, secrets.token_urlsafe(32), now, now)
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def find(self, session_id: str | None) -> tuple[Session, Credential] | None:
        """The live session of a cookie's value and its credential (marked used), or None."""
        if not session_id or len(session_id) > 128:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self.clock()
        credential = self.keys.by_id(session.credential_id)
        if (
            now - session.seen > self.idle
            or now - session.opened > self.lifetime
            or credential is None
            or credential.role not in DASHBOARD_ROLES
        ):
            del self._sessions[key]
            return None
        session.seen = now
        self._sessions.move_to_end(key)
        return session, credential

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_digest(session_id), None)

    def _expire(self, now: float) -> None:
        while self._sessions:
            key, oldest = next(iter(self._sessions.items()))
            if now - oldest.seen <= self.idle and now - oldest.opened <= self.lifetime:
                # The rest were used later; one opened long ago is found (and dropped) on its next use.
                break
            del self._sessions[key]


def csrf_ok(session: Session, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(session.csrf.encode(), str(token).encode())


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


def cookie_name(request: web.BaseRequest) -> str:
    return SECURE_COOKIE if request.secure else COOKIE


def session_cookie(request: web.BaseRequest) -> str | None:
    """The value of the request's session cookie, if it has one."""
    return request.cookies.get(cookie_name(request))


def set_cookie(response: web.StreamResponse, request: web.Request, session_id: str) -> None:
    response.set_cookie(
        cookie_name(request), session_id, path="/", httponly=True, secure=request.secure, samesite="Strict"
    )


def clear_cookie(response: web.StreamResponse, request: web.Request) -> None:
    response.del_cookie(
        cookie_name(request), path="/", secure=request.secure, httponly=True, samesite="Strict"
    )


def session_middleware(store: SessionStore) -> Middleware:
    """Authenticate `/admin/...` requests that carry no key by the dashboard's session (module docstring)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.path.startswith("/admin/")
            and headers.API_KEY not in request.headers
            and "Authorization" not in request.headers
            and cookie_name(request) in request.cookies
        ):
            found = store.find(session_cookie(request))
            if found is not None:  # an unknown or expired session: the route answers 401 as to anyone
                session, credential = found
                if not csrf_ok(session, request.headers.get(CSRF_HEADER)):
                    return error_response(
                        CsrfMismatch(f"a dashboard session must send its CSRF token in {CSRF_HEADER}")
                    )
                request[AUTHENTICATED] = credential
        return await handler(request)

    return middleware
