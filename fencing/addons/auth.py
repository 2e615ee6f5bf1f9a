"""Auth addon: who is calling. Workers authenticate with `Proxy-Authorization: Basic id:secret`, their
own credential from the gateway's key file (docs/contracts.md, *Worker identity*).

- HTTPS goes through a CONNECT tunnel: the credential is on the CONNECT (`http_connect`), and the worker
  is remembered for that client connection, so every request inside the tunnel is attributed to it.
- Plain HTTP is sent to the proxy in absolute form: the credential rides on each request.
- Missing, unknown or wrong credentials (or a role other than worker/admin) get 407 with
  `Proxy-Authenticate` and a JSON body; the call is still recorded by capture.
- One tenant per proxy: the control stream tells a proxy only the fences and token floors of its control
  key's tenant (queue_core.scope), so a credential of another tenant gets 407 `tenant_not_served` (recorded
  with its worker id and tenant): letting it through would let a fenced worker or a stale lease pass. An
  `operator` control key serves every tenant; a proxy without a control stream (standalone: nothing is
  fenced) serves every tenant of its key file.
- The Proxy-Authorization header never leaves the proxy (removed before anything else sees the flow).
"""

from __future__ import annotations

import binascii
import hmac
import logging
from pathlib import Path

from mitmproxy import connection, exceptions, http
from mitmproxy.addonmanager import Loader

from access.keys import Credential, KeyFileError, KeyRing
from access.permissions import CONTROL_ROLES, PROXY_CALL_ROLES, spans_tenants
from fencing.addons.control import control_credential
from fencing.context import CallContext, ensure_context, refuse
from fencing.runtime import ProxyRuntime
from protocol import errors
from wirelog.record import ACTION_BLOCK

log = logging.getLogger("strictq.proxy.auth")

REALM = "strictq egress proxy"
SERVED_OPTIONS = frozenset(
    {"strictq_keys", "strictq_control", "strictq_control_key", "strictq_control_key_id"}
)  # what decides the tenant served (the control options are the control addon's)
CACHE_LIMIT = 4096  # validated header values remembered (a worker sends the same value every time)


class Auth:
    """Authenticates every call and sets `CallContext.worker` / `.tenant`."""

    def __init__(self, runtime: ProxyRuntime) -> None:
        self.runtime = runtime
        self.keys: KeyRing | None = None
        # client connection id -> credential, for requests inside an authenticated CONNECT tunnel
        self.tunnels: dict[str, Credential] = {}
        # exact header value -> credential: skips base64 and the constant-time compare on repeat calls
        self._valid: dict[str, Credential] = {}
        # the one tenant whose workers this proxy serves; None: every tenant (operator key, standalone)
        self.tenant: str | None = None
        self._warned: set[str] = set()  # credentials already logged as refused for their tenant

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "strictq_keys",
            str,
            "",
            "Key file (TOML, the gateway's) with the workers' credentials; empty: every call gets 407.",
        )

    def configure(self, updated: set[str]) -> None:
        if not updated & SERVED_OPTIONS:
            return
        from mitmproxy import ctx

        self._valid.clear()
        if "strictq_keys" in updated:
            path = ctx.options.strictq_keys
            try:
                self.keys = KeyRing.load(Path(path)) if path else None
            except KeyFileError as exc:
                raise exceptions.OptionsError(str(exc)) from exc
        self.tenant = served_tenant(self.keys, _option("strictq_keys"), _control_settings())
        self._warned.clear()

    # ----------------------------------------------------------------------------------------- hooks
    def http_connect(self, flow: http.HTTPFlow) -> None:
        ctx = ensure_context(flow)
        credential = self._authenticate(flow, ctx)
        if credential is not None:
            self.tunnels[flow.client_conn.id] = credential

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        ctx = ensure_context(flow)
        credential = self.tunnels.get(flow.client_conn.id)
        if credential is not None and not self._serves(credential):
            self.tunnels.pop(flow.client_conn.id, None)  # the tenant served changed since the CONNECT
            take_proxy_authorization(flow.request.headers)
            self._refuse_tenant(flow, ctx, credential)
            return
        if credential is not None:  # inside an authenticated tunnel
            ctx.worker = credential.id
            ctx.tenant = credential.tenant
            take_proxy_authorization(flow.request.headers)  # never forwarded, even inside a tunnel
            return
        self._authenticate(flow, ctx)

    def client_disconnected(self, client: connection.Client) -> None:
        self.tunnels.pop(client.id, None)

    # -------------------------------------------------------------------------------------- internals
    def _authenticate(self, flow: http.HTTPFlow, ctx: CallContext) -> Credential | None:
        value = take_proxy_authorization(flow.request.headers)  # never forwarded, never logged
        credential = self._valid.get(value) if value is not None else None
        if credential is None:
            credential, code = self._check(value)
            if credential is None:
                self.runtime.count(f"auth.{code}")
                refuse(
                    flow,
                    ctx,
                    status=407,
                    action=ACTION_BLOCK,
                    code=code,
                    message="proxy authentication required: Proxy-Authorization Basic <worker id>:<secret>",
                    extra_headers={"Proxy-Authenticate": f'Basic realm="{REALM}"'},
                    announce=False,
                )
                return None
            if len(self._valid) >= CACHE_LIMIT:
                self._valid.clear()
            assert value is not None
            self._valid[value] = credential
        if not self._serves(credential):
            self._refuse_tenant(flow, ctx, credential)
            return None
        ctx.worker = credential.id
        ctx.tenant = credential.tenant
        return credential

    def _serves(self, credential: Credential) -> bool:
        return self.tenant is None or credential.tenant == self.tenant

    def _refuse_tenant(self, flow: http.HTTPFlow, ctx: CallContext, credential: Credential) -> None:
        """407 for an authentic credential of a tenant this proxy does not serve: the proxy does not know
        that tenant's fences and floors. Recorded with the worker and its tenant (that tenant's record)."""
        ctx.worker = credential.id
        ctx.tenant = credential.tenant
        self.runtime.count(f"auth.{errors.TENANT_NOT_SERVED}")
        if credential.id not in self._warned and len(self._warned) < CACHE_LIMIT:
            self._warned.add(credential.id)
            log.warning(
                "refusing %s of tenant %s: this proxy serves tenant %s only (its control key's)",
                credential.id,
                credential.tenant,
                self.tenant,
            )
        refuse(
            flow,
            ctx,
            status=407,
            action=ACTION_BLOCK,
            code=errors.TENANT_NOT_SERVED,
            message=f"tenant {credential.tenant!r} is not served by this proxy (its control key is another "
            "tenant's): use a proxy of your tenant",
            extra_headers={"Proxy-Authenticate": f'Basic realm="{REALM}"'},
            announce=False,
        )

    def _check(self, value: str | None) -> tuple[Credential | None, str]:
        """The credential for a header value, or None and the refusal code."""
        if not value:
            return None, errors.PROXY_AUTH_REQUIRED
        parsed = parse_basic(value)
        if parsed is None:
            return None, errors.BAD_PROXY_AUTHORIZATION
        key_id, secret = parsed
        credential = self.keys.by_id(key_id) if self.keys is not None else None
        # compare even for unknown ids, so timing does not tell known ids apart
        expected = credential.secret if credential is not None else "\0" * 24
        if not hmac.compare_digest(expected.encode(), secret.encode()) or credential is None:
            return None, errors.BAD_CREDENTIALS
        if credential.role not in PROXY_CALL_ROLES:
            return None, errors.ROLE_NOT_ALLOWED
        return credential, ""


def served_tenant(keys: KeyRing | None, path: str, control: tuple[str, str, str] | None) -> str | None:
    """The one tenant a proxy serves: its control key's; None (every tenant) for an `operator` key or
    without a control stream. `control` is (url, key secret, key id), as the control addon's options.
    A control key the key file does not hold is refused at start: its tenant cannot be told."""
    if control is None or keys is None:
        return None
    url, secret, key_id = control
    if not url.strip():
        return None
    if secret:
        credential = keys.by_secret(secret)
        if credential is None or credential.role not in CONTROL_ROLES:
            raise exceptions.OptionsError(
                f"strictq_control_key is not the secret of a {'/'.join(CONTROL_ROLES)} credential of the "
                f"key file {path}: the proxy cannot tell which tenant's workers it serves"
            )
    else:
        credential = control_credential(keys, path, key_id)
    return None if spans_tenants(credential) else credential.tenant


def _option(name: str) -> str:
    """A string option, "" while no addon declares it (the control addon comes after this one)."""
    from mitmproxy import ctx

    return str(getattr(ctx.options, name)) if name in ctx.options else ""


def _control_settings() -> tuple[str, str, str] | None:
    """(url, key, key id) of the control addon's options; None when it is not loaded (unit tests)."""
    from mitmproxy import ctx

    if "strictq_control" not in ctx.options:
        return None
    return _option("strictq_control"), _option("strictq_control_key"), _option("strictq_control_key_id")


def take_proxy_authorization(headers: http.Headers) -> str | None:
    """Remove every Proxy-Authorization field; return the first value. One pass over the raw fields
    (mitmproxy's case-insensitive `get` + `del` cost two normalising scans on every plain-HTTP call)."""
    fields = headers.fields
    for index, (name, value) in enumerate(fields):
        if len(name) == 19 and name.lower() == b"proxy-authorization":
            rest = tuple(f for f in fields[index + 1 :] if f[0].lower() != b"proxy-authorization")
            headers.fields = fields[:index] + rest
            return value.decode("latin-1")
    return None


def parse_basic(value: str) -> tuple[str, str] | None:
    """`Basic base64(id:secret)` -> (id, secret); None when it is not that."""
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = binascii.a2b_base64(encoded.strip().encode("ascii"), strict_mode=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        return None
    key_id, sep, secret = decoded.partition(":")
    if not sep or not key_id:
        return None
    return key_id, secret
