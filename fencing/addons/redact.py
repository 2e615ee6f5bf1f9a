"""Redact addon: what of a call may be written down. Wraps wirelog's `Redactor` (header omission kept as
byte count + sha256, JSON-field and query-parameter blacklists replaced by a stable token, per-endpoint
log levels) and builds the *views* capture writes; nothing else in the proxy writes content to disk.

- In `request` (before the guards) it builds the redacted request view and `ctx.request_identity`
  (method, host, path, query, body sha256, all after redaction: how mimicry recognises "the same
  request"); in `response` (before capture) the response view. At level `on-failure` a call that
  succeeded is cut down to metadata there.
- The real request and response are never modified: views are new dicts.

Options: `strictq_redaction` (config file; empty: wirelog's defaults), `strictq_redaction_key_dir`
(directory of `redaction.key`, the key of the stable tokens, created on first use; all processes of one
deployment share it, so a secret maps to the same token in every record).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mitmproxy import exceptions, http
from mitmproxy.addonmanager import Loader

from fencing.context import CallContext, ensure_context
from fencing.mimic import identity_from_url
from fencing.runtime import ProxyRuntime
from wirelog.record import body_fields, header_block
from wirelog.redaction import Level, RedactionConfig, Redactor, load_or_create_key

_DEFAULT_PORTS = {"http": 80, "https": 443}


class Redact:
    def __init__(self, runtime: ProxyRuntime) -> None:
        self.runtime = runtime
        self.redactor: Redactor | None = None
        self.max_body_bytes: int | None = None

    def load(self, loader: Loader) -> None:
        add = loader.add_option
        add("strictq_redaction", str, "", "Redaction config file (TOML); empty: built-in defaults.")
        add(
            "strictq_redaction_key_dir",
            str,
            "",
            "Directory of redaction.key, the key of the stable tokens (created if missing; share it "
            "between the processes of one deployment). Required.",
        )

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if not updated & {"strictq_redaction", "strictq_redaction_key_dir"}:
            return
        path = ctx.options.strictq_redaction
        key_dir = ctx.options.strictq_redaction_key_dir
        if not key_dir:
            self.redactor = None  # nothing can be logged without a key: capture writes no content
            return
        try:
            config = RedactionConfig.load(Path(path)) if path else RedactionConfig.default()
            key = load_or_create_key(Path(key_dir))
            self.redactor = Redactor(config, key)
        except Exception as exc:  # wirelog's ConfigError names the file and the line
            raise exceptions.OptionsError(f"redaction: {exc}") from exc
        self.max_body_bytes = config.max_body_bytes

    # ----------------------------------------------------------------------------------------- hooks
    def request(self, flow: http.HTTPFlow) -> None:
        self.request_view(flow, ensure_context(flow))

    def response(self, flow: http.HTTPFlow) -> None:
        ctx = ensure_context(flow)
        if ctx.request_view is None:
            self.request_view(flow, ctx)
        self.response_view(flow, ctx)

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        self.ensure_views(flow, ensure_context(flow))

    def ensure_views(self, flow: http.HTTPFlow, ctx: CallContext) -> None:
        """Build whichever view is missing (capture calls this for calls that skipped our hooks)."""
        if ctx.request_view is None:
            self.request_view(flow, ctx)
        if ctx.response_view is None and flow.response is not None:
            self.response_view(flow, ctx)

    # ------------------------------------------------------------------------------------------ views
    def request_view(self, flow: http.HTTPFlow, ctx: CallContext) -> None:
        redactor = self.redactor
        if redactor is None:
            return
        request = flow.request
        method = request.method
        if method == "CONNECT":  # authority-form: host:port; its headers held only the credential
            ctx.log_level = Level.METADATA.value
            ctx.request_view = _view(
                method=method, url=f"{request.host}:{request.port}", pairs=[], body=None, level=Level.METADATA
            )
            return
        scheme = request.scheme
        host = request.host
        port = request.port
        authority = host if port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
        path = request.path
        url = redactor.url(f"{scheme}://{authority}{path}")
        level = redactor.level_for(authority, path)
        ctx.log_level = level.value
        content_type, body = _content(request)
        if body:
            body = redactor.body(content_type, body)
        pairs = redactor.headers(request.headers.fields)
        # on-failure is resolved when the outcome is known (response / error): full until then
        shown = Level.FULL if level is Level.ON_FAILURE else level
        view = _view(method=method, url=url, pairs=pairs, body=body, level=shown, limit=self.max_body_bytes)
        ctx.request_view = view
        ctx.request_identity = _identity(method, authority, url, view["body_sha256"] or "")

    def response_view(self, flow: http.HTTPFlow, ctx: CallContext) -> None:
        redactor = self.redactor
        response = flow.response
        if redactor is None or response is None:
            return
        endpoint_level = Level(ctx.log_level)
        level = Redactor.effective(endpoint_level, status=response.status_code, error=ctx.error)
        if endpoint_level is Level.ON_FAILURE and level is Level.METADATA and ctx.request_view is not None:
            ctx.request_view = _to_metadata(ctx.request_view)
        content_type, body = _content(response)
        if body:
            body = redactor.body(content_type, body)
        pairs = redactor.headers(response.headers.fields)
        ctx.response_view = _view(
            status=response.status_code, pairs=pairs, body=body, level=level, limit=self.max_body_bytes
        )


def _content(message: http.Message) -> tuple[str | None, bytes]:
    """Content-Type and the decoded body, from one pass over the raw header fields (mitmproxy's
    case-insensitive lookups would scan and normalise them once per header asked for)."""
    content_type: bytes | None = None
    encoded = False
    for name, value in message.headers.fields:
        size = len(name)
        if size == 12 and name.lower() == b"content-type":
            content_type = value
        elif size == 16 and name.lower() == b"content-encoding":
            encoded = True
    body = message.get_content(strict=False) if encoded else message.raw_content
    return (content_type.decode("latin-1") if content_type is not None else None), body or b""


def _identity(method: str, authority: str, url: str, body_sha256: str) -> tuple[str, str, str, str, str]:
    """`fencing.mimic.identity_from_url` without re-parsing the URL we just built: the redactor only
    rewrites the query (and user-info, which requests to a proxy do not have). IPv6 literals and
    anything unusual take the general path, so recordings and live calls always agree."""
    if "[" in authority or "@" in url:
        return identity_from_url(method, url, body_sha256)
    rest = url[url.index("://") + 3 + len(authority) :]
    path, _, query = rest.partition("?")
    if path.startswith("//") or "#" in rest:
        return identity_from_url(method, url, body_sha256)
    return (method.upper(), authority.lower(), path or "/", query, body_sha256)


def _view(
    *, pairs: list[list[str]], body: bytes | None, level: Level, limit: int | None = None, **head: Any
) -> dict[str, Any]:
    """A request (method, url) or response (status) view of the schema at a resolved level."""
    view = dict(head)
    if level is Level.FULL:
        view["headers"] = pairs
        view["headers_omitted"] = None
    else:
        view["headers"] = None
        view["headers_omitted"] = header_block(pairs)
    keep = level is Level.FULL or level is Level.HEADERS_OMITTED
    view.update(body_fields(body, keep=keep, max_bytes=limit))
    return view


def _to_metadata(view: dict[str, Any]) -> dict[str, Any]:
    """Cut a full view down to metadata (on-failure level, call succeeded): hashes and sizes stay."""
    out = dict(view)
    headers = out.get("headers")
    if headers is not None:
        out["headers"] = None
        out["headers_omitted"] = header_block(headers)
    out["body"] = None
    out["body_b64"] = None
    return out
