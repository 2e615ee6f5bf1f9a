"""Redaction engine: what of a call may reach the wire log (used by the proxy's redact addon and the gateway).

Secrets are replaced by a stable token, `redacted:` + the first 16 hex digits of HMAC-SHA256(key, value),
with a per-deployment key (`redaction.key`, 32 random bytes, mode 0600). Equal secrets give equal
tokens, so requests still match for mimicry and search, but a low-entropy secret (a PIN, a short
password) cannot be brute-forced from the log without the key.

What is redacted: secret headers (by name), JSON body fields (by name, at any depth), query parameters
and form fields (by name), and URL user-info. Per-endpoint levels decide how much else is kept:
`full`, `headers-omitted` (header block kept as byte count + sha256), `metadata` (no headers, no
bodies: hashes and sizes only) and `on-failure` (full when the call failed, else metadata).
Hashes are always of the *redacted* bytes.
"""

from __future__ import annotations

import fnmatch
import functools
import hmac
import json
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus

import orjson

from wirelog.errors import ConfigError
from wirelog.files import StartupError, private_dir
from wirelog.layout import fsync_dir
from wirelog.record import HeaderPairs, Record, header_block, header_text, http_request, http_response

log = logging.getLogger("wirelog")

KEY_FILE = "redaction.key"
KEY_BYTES = 32
TOKEN_PREFIX = "redacted:"


class Level(StrEnum):
    """How much of an endpoint's traffic is logged (reduced levels still get a record: docs/wirelog.md)."""

    FULL = "full"
    HEADERS_OMITTED = "headers-omitted"
    METADATA = "metadata"
    ON_FAILURE = "on-failure"


def fold(name: str) -> str:
    """How names are compared: case-insensitive, `-` and `_` alike (`X-Auth-Token` = `x_auth_token`)."""
    return name.lower().replace("-", "_")


_NOT_ALNUM = re.compile(r"[^0-9a-z]+")


@functools.lru_cache(maxsize=4096)
def squash(name: str) -> str:
    """How names are matched against the secret suffixes: lowercase letters and digits only, so
    `creditCardNumber`, `card[number]`, `X-Goog-Api-Key` and `ocp_apim_subscription_key` become
    `creditcardnumber`, `cardnumber`, `xgoogapikey` and `ocpapimsubscriptionkey`."""
    return _NOT_ALNUM.sub("", name.lower())


# Names are compared folded (see `fold`); docs/wirelog.md lists them. Card numbers, CVVs, API keys, auth and
# session tokens, and private keys: what a payment or identity call carries.
_TOKEN_NAMES = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "client_secret",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth_token",
        "x_auth_token",
        "api_key",
        "apikey",
        "x_api_key",
        "private_key",
        "authorization",
        "session",
        "sessionid",
        "session_id",
        "x_session_id",
    }
)
_CARD_NAMES = frozenset(
    {"card_number", "cardnumber", "pan", "cc_number", "ccnumber", "cvv", "cvc", "cvv2", "cvc2"}
)
DEFAULT_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "apikey",
        "x-bv-api-key",
        "x-auth-token",
        "auth-token",
        "x-access-token",
        "x-session-id",
        "session-id",
        "x-amz-security-token",
        "x-csrf-token",
    }
)  # X-Strictq-Lease is not a secret: it is how calls are matched to claims.
DEFAULT_JSON_FIELDS = _TOKEN_NAMES | _CARD_NAMES
# Any header, JSON field, query parameter or form field whose squashed name (`squash`) *ends with* one of
# these is secret too, whatever comes before: `X-Api-Token`, `Private-Token`, `X-Shopify-Access-Token`,
# `X-Goog-Api-Key`, `Ocp-Apim-Subscription-Key`, `creditCardNumber`, `db_password`, `JSESSIONID`. A JSON
# field is also matched with its parent object's name in front, as a form name spells it: `{"card":
# {"number": ...}}` is `card[number]`, `cardnumber`. (Short names such as `pan` stay exact names above.)
DEFAULT_SECRET_SUFFIXES = frozenset(
    {
        "token",
        "apikey",
        "secret",
        "secretkey",
        "accesskey",
        "privatekey",
        "password",
        "passwd",
        "sessionid",
        "subscriptionkey",
        "cardnumber",
        "ccnumber",
        "cvc",
        "cvc2",
        "cvv",
        "cvv2",
    }
)
# Query parameters and form fields (url-encoded and multipart) take these and the JSON field names.
DEFAULT_QUERY_PARAMS = DEFAULT_JSON_FIELDS | frozenset(
    {"signature", "sig", "x-amz-signature", "x-amz-security-token"}
)
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


# ------------------------------------------------------------------------------------------ config
@dataclass(frozen=True, slots=True)
class EndpointRule:
    """`host` is a glob (`*.example.com`, matched with and without the port), `path` a prefix or a glob."""

    host: str
    path: str
    level: Level
    _host_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _path_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_host_re", re.compile(fnmatch.translate(self.host.lower())))
        is_glob = any(ch in self.path for ch in "*?[")
        object.__setattr__(self, "_path_re", re.compile(fnmatch.translate(self.path)) if is_glob else None)

    def matches(self, host: str, path: str) -> bool:
        host = host.lower()
        if not self._host_re.match(host):
            bare = _strip_port(host)
            if bare == host or not self._host_re.match(bare):
                return False
        if self._path_re is not None:
            return self._path_re.match(path) is not None
        return path.startswith(self.path)


@dataclass(frozen=True, slots=True)
class RedactionConfig:
    """What to redact and at which level to log each endpoint (first matching rule wins)."""

    secret_headers: frozenset[str] = DEFAULT_SECRET_HEADERS
    json_fields: frozenset[str] = DEFAULT_JSON_FIELDS
    query_params: frozenset[str] = DEFAULT_QUERY_PARAMS
    secret_suffixes: frozenset[str] = DEFAULT_SECRET_SUFFIXES  # for every kind of name (`squash`)
    endpoints: tuple[EndpointRule, ...] = ()
    default_level: Level = Level.FULL
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES  # bodies above: hash and size only

    _KEYS = frozenset(
        {
            "defaults",
            "secret_headers",
            "json_fields",
            "query_params",
            "secret_suffixes",
            "endpoints",
            "default_level",
            "max_body_bytes",
        }
    )

    @classmethod
    def default(cls) -> RedactionConfig:
        return cls()

    @classmethod
    def load(cls, path: Path | str) -> RedactionConfig:
        """Read a TOML file (docs/wirelog.md); a top-level `[redaction]` table is used when present."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read redaction config {path}: {exc}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        section = data.get("redaction", data)
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: [redaction] must be a table")
        return cls.from_dict(section, source=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "redaction config") -> RedactionConfig:
        """Lists extend the defaults unless `defaults = false`; unknown keys are errors (typos leak)."""
        unknown = set(data) - cls._KEYS
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}")
        keep_defaults = data.get("defaults", True)
        if not isinstance(keep_defaults, bool):
            raise ConfigError(f"{source}: defaults must be true or false")

        def names(key: str, default: frozenset[str]) -> frozenset[str]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{source}: {key} must be a list of non-empty strings")
            return frozenset(v.lower() for v in value) | (default if keep_defaults else frozenset())

        rules: list[EndpointRule] = []
        raw_rules = data.get("endpoints", [])
        if not isinstance(raw_rules, list):
            raise ConfigError(f"{source}: endpoints must be an array of tables ([[endpoints]])")
        for index, raw in enumerate(raw_rules, 1):
            if not isinstance(raw, dict) or set(raw) - {"host", "path", "level"} or "level" not in raw:
                raise ConfigError(f"{source}: endpoints #{index} takes host, path and level (level required)")
            host, path = raw.get("host", "*"), raw.get("path", "/")
            if not isinstance(host, str) or not host or not isinstance(path, str) or not path:
                raise ConfigError(f"{source}: endpoints #{index}: host and path must be non-empty strings")
            rules.append(EndpointRule(host, path, _level(raw["level"], f"{source}: endpoints #{index}")))
        max_body = data.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
        if not isinstance(max_body, int) or isinstance(max_body, bool) or max_body < 0:
            raise ConfigError(f"{source}: max_body_bytes must be an integer >= 0 (0 = unlimited)")
        return cls(
            secret_headers=names("secret_headers", DEFAULT_SECRET_HEADERS),
            json_fields=names("json_fields", DEFAULT_JSON_FIELDS),
            query_params=names("query_params", DEFAULT_QUERY_PARAMS),
            secret_suffixes=frozenset(squash(v) for v in names("secret_suffixes", DEFAULT_SECRET_SUFFIXES))
            - {""},
            endpoints=tuple(rules),
            default_level=_level(data.get("default_level", "full"), source),
            max_body_bytes=max_body or None,
        )


def _level(value: object, where: str) -> Level:
    if isinstance(value, str) and value in Level.__members__.values():
        return Level(value)
    choices = ", ".join(level.value for level in Level)
    raise ConfigError(f"{where}: level {value!r} is not one of {choices}")


# --------------------------------------------------------------------------------------------- key
class RedactionKeyError(ConfigError, StartupError):
    """redaction.key cannot be read, created, or is not a key: a start-up fault naming the file."""

    def __init__(self, path: Path, problem: str, action: str) -> None:
        StartupError.__init__(self, path, problem, action)


def load_or_create_key(data_dir: Path | str) -> bytes:
    """The deployment's redaction key (`<data_dir>/redaction.key`), created 0600 on first use.

    Creation is atomic (written aside, fsynced, then hard-linked into place), so two processes
    starting together (gateway and proxy) agree on one key and a crash never leaves an empty key.
    A damaged key is refused, never replaced: records tokenized with the old key would no longer match.
    """
    directory = Path(data_dir)
    path = directory / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        try:
            private_dir(directory)
            tmp = directory / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process created it first: use theirs
            finally:
                tmp.unlink()
            fsync_dir(directory)
            key = path.read_bytes()
        except OSError as exc:
            raise RedactionKeyError(
                path,
                f"cannot create the redaction key ({exc.strerror or exc})",
                "make its directory writable by this user",
            ) from exc
    except OSError as exc:
        raise RedactionKeyError(
            path, f"cannot read the redaction key ({exc.strerror or exc})", "make it readable by this user"
        ) from exc
    if len(key) != KEY_BYTES:
        raise RedactionKeyError(
            path,
            f"a redaction key is {KEY_BYTES} bytes, this file has {len(key)}",
            "restore it from a backup (a new key would tokenize secrets differently from the records "
            "already written), or remove it to start with a new key",
        )
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("wirelog: %s is readable by others (mode %o); it should be 0600", path, mode)
    return key


# ---------------------------------------------------------------------------------------- redactor
_JSON_TYPES = ("application/json", "text/json")
_AUTH_HEADERS = frozenset({"authorization", "proxy_authorization"})  # folded
_BOUNDARY = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_DISPOSITION_NAME = re.compile(rb'(?im)^content-disposition:[^\r\n]*?\bname="([^"]*)"')
_PART_TYPE = re.compile(rb"(?im)^content-type:([^\r\n]*)")
_CHARSET = re.compile(r'charset\s*=\s*"?([^";\s]+)', re.IGNORECASE)
_UTF8 = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
_AUTH_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9._~+-]*) +(\S.*)$", re.DOTALL)


class Redactor:
    """Applies a RedactionConfig with a key. Stateless after construction; safe to share."""

    def __init__(self, config: RedactionConfig, key: bytes) -> None:
        if len(key) < 16:
            raise ConfigError("the redaction key must be at least 16 bytes")
        self.config = config
        self._key = bytes(key)
        self._secret_headers = frozenset(fold(name) for name in config.secret_headers)
        self._json_fields = frozenset(fold(name) for name in config.json_fields)
        self._query_params = frozenset(fold(name) for name in config.query_params)
        self._form_fields = self._json_fields | self._query_params
        # Both spellings of each folded name, for the byte-level pre-check and the textual fallback.
        spellings = {v for name in self._json_fields for v in (name, name.replace("_", "-"))}
        self._needles = tuple(sorted(name.encode() for name in spellings))
        self._suffixes = tuple(sorted(config.secret_suffixes))
        self._scrub_re: re.Pattern[bytes] | None = None
        self._maybe_secret_key = _maybe_secret_key_re(self._json_fields, self._suffixes)
        if self._json_fields or self._suffixes:
            # A suffix in a key, with anything before it and separators between its letters.
            between = rb'[^"\\a-z0-9]*'
            ends = [rb'[^"\\]*?' + between.join(re.escape(c.encode()) for c in end) for end in self._suffixes]
            names = b"|".join([re.escape(name.encode()) for name in sorted(spellings)] + ends)
            self._scrub_re = re.compile(
                rb'("(?:' + names + rb')"\s*:\s*)("(?:[^"\\]|\\.)*"?|[^,}\]\s]*)', re.IGNORECASE
            )

    # ------------------------------------------------------------------------------- primitives
    def token(self, value: str | bytes) -> str:
        """`redacted:<16 hex>`: stable for equal values under one key, useless without the key."""
        data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        return TOKEN_PREFIX + hmac.digest(self._key, data, "sha256").hex()[:16]

    def headers(self, pairs: HeaderPairs) -> list[list[str]]:
        """Header pairs as `[name, value]` text, secret values replaced by tokens (names and order kept)."""
        out: list[list[str]] = []
        for raw_name, raw_value in pairs:
            name = header_text(raw_name)
            value = header_text(raw_value)
            folded = fold(name)
            if folded in self._secret_headers or self._by_suffix(name):
                value = self._secret_header(folded, value)
            out.append([name, value])
        return out

    def _by_suffix(self, name: str, parent: str = "") -> bool:
        """Whether `name` (after `parent`, a JSON field's enclosing object) ends with a secret suffix."""
        if not self._suffixes:
            return False
        return squash(name).endswith(self._suffixes) or (
            parent != "" and squash(parent + name).endswith(self._suffixes)
        )

    def _secret_name(self, exact: frozenset[str], name: str, parent: str = "") -> bool:
        return fold(name) in exact or self._by_suffix(name, parent)

    def _secret_header(self, lower: str, value: str) -> str:
        if lower in _AUTH_HEADERS:  # keep the scheme ("Bearer", "Basic"): it is useful and not secret
            match = _AUTH_SCHEME.match(value)
            if match:
                return f"{match.group(1)} {self.token(match.group(2))}"
        elif lower == "cookie":  # keep cookie names, hide every value
            return "; ".join(self._cookie_pair(part.strip()) for part in value.split(";") if part.strip())
        elif lower == "set_cookie":  # hide the value, keep the attributes (Path, Expires, ...)
            first, sep, attributes = value.partition(";")
            return self._cookie_pair(first.strip()) + sep + attributes
        return self.token(value)

    def _cookie_pair(self, pair: str) -> str:
        name, sep, value = pair.partition("=")
        return f"{name}={self.token(value)}" if sep else self.token(pair)

    def url(self, url: str) -> str:
        """The URL with user-info and secret query-parameter values tokenized; everything else verbatim."""
        scheme_end = url.find("://")
        if scheme_end >= 0:
            start = scheme_end + 3
            stop = min((i for i in (url.find(ch, start) for ch in "/?#") if i >= 0), default=len(url))
            userinfo, at, _ = url[start:stop].rpartition("@")
            if at and not _is_token(userinfo):
                url = url[:start] + self.token(unquote(userinfo)) + url[start + len(userinfo) :]
        fragment_at = url.find("#")
        end = len(url) if fragment_at < 0 else fragment_at
        query_at = url.find("?", 0, end)
        if query_at < 0:
            return url
        return url[: query_at + 1] + self.query(url[query_at + 1 : end]) + url[end:]

    def query(self, query: str, *, names: frozenset[str] | None = None) -> str:
        """`a=1&token=x` -> `a=1&token=redacted:...` (names matched decoded and case-insensitively)."""
        secret = self._query_params if names is None else names
        if not query or not (secret or self._suffixes):
            return query
        parts = query.split("&")
        changed = False
        for index, part in enumerate(parts):
            name, sep, value = part.partition("=")
            if sep and value and self._secret_name(secret, unquote_plus(name)) and not _is_token(value):
                parts[index] = f"{name}={self.token(unquote_plus(value))}"
                changed = True
        return "&".join(parts) if changed else query

    def body(self, content_type: str | None, data: bytes) -> bytes:
        """The body with secret JSON fields (any depth) or form fields tokenized; other bodies unchanged.

        JSON is rewritten only when a field was replaced (else the original bytes are kept). A body
        that claims or looks like JSON but does not parse is scrubbed textually as a fallback.
        """
        if not data:
            return data
        media = _media(content_type)
        if media in _JSON_TYPES or media.endswith("+json") or media in ("", "text/plain"):
            charset = _foreign_charset(content_type, data)
            if charset is not None:  # UTF-16 and others: redacted as text, kept in their own charset
                return self._foreign(content_type, media, charset, data)
        return self._body(content_type, media, data)

    def _body(self, content_type: str | None, media: str, data: bytes) -> bytes:
        """`body` of a UTF-8 (or ASCII-compatible) body."""
        is_json = media in _JSON_TYPES or media.endswith("+json")
        if media == "application/x-www-form-urlencoded":
            text = data.decode("utf-8", "surrogateescape")
            redacted = self.query(text, names=self._form_fields)
            return data if redacted is text else redacted.encode("utf-8", "surrogateescape")
        if media == "multipart/form-data":
            return self._multipart(content_type or "", data)
        if not is_json and not (media in ("", "text/plain") and data.lstrip()[:1] in (b"{", b"[")):
            return data
        if not self._json_fields and not self._suffixes:
            return data
        if b":" not in data:  # no key at all (a JSON string or list of scalars): nothing to parse or scrub
            return data
        if data.isascii() and b"\\" not in data and self._maybe_secret_key.search(data) is None:
            return data  # no key here can be secret, parsed or scrubbed (see _maybe_secret_key_re)
        lowered = data.lower()
        if not self._suffixes and not any(n in lowered for n in self._needles) and b"\\u" not in data:
            return data  # no blacklisted name anywhere (and no escapes that could spell one)
        try:
            document = _loads(data)
        except ValueError:
            return self._scrub(data)
        try:
            redacted, changed = self._redact_json(document)
        except RecursionError:
            return self._scrub(data)
        if not changed:
            return data
        return _dumps(redacted)

    def value(self, document: Any) -> Any:
        """A JSON-like value (e.g. message attributes) with blacklisted fields tokenized at any depth."""
        return self._redact_json(document)[0]

    def _redact_json(self, node: Any, parent: str = "") -> tuple[Any, bool]:
        if isinstance(node, dict):
            changed = False
            out: dict[str, Any] = {}
            for key, item in node.items():
                if isinstance(key, str) and self._secret_name(self._json_fields, key, parent):
                    if isinstance(item, str) and _is_token(item):
                        out[key] = item
                    else:
                        out[key] = self.token(item if isinstance(item, str) else _canonical(item))
                        changed = True
                else:
                    out[key], sub = self._redact_json(item, key if isinstance(key, str) else "")
                    changed = changed or sub
            return (out, True) if changed else (node, False)
        if isinstance(node, list):
            items = [self._redact_json(item, parent) for item in node]
            if any(sub for _, sub in items):
                return [item for item, _ in items], True
            return node, False
        return node, False

    def _multipart(self, content_type: str, data: bytes) -> bytes:
        """multipart/form-data with the content of each secret field (by its `name`) tokenized; parts are
        split on the boundary by hand because the stdlib's parsers do not give the bytes back unchanged."""
        match = _BOUNDARY.search(content_type)
        if match is None:
            return data
        delimiter = b"--" + (match.group(1) or match.group(2)).encode("latin-1", "replace")
        pieces = data.split(delimiter)
        changed = False
        for index in range(1, len(pieces)):  # pieces[0] is the preamble; a piece starting "--" ends it
            piece = pieces[index]
            head_end = piece.find(b"\r\n\r\n")
            if piece.startswith(b"--") or head_end < 0:
                continue
            name = _DISPOSITION_NAME.search(piece[:head_end])
            content = piece[head_end + 4 :]
            trailer = b"\r\n" if content.endswith(b"\r\n") else b""
            value = content[: len(content) - len(trailer)]
            field_name = name.group(1).decode("utf-8", "replace") if name is not None else None
            if field_name is None or not self._secret_name(self._form_fields, field_name):
                # Not a secret field: its content is redacted as the body it is (a JSON file part, say).
                part_type = _PART_TYPE.search(piece[:head_end])
                inner = self.body(part_type.group(1).decode("latin-1").strip() if part_type else None, value)
                if inner != value:
                    pieces[index] = piece[: head_end + 4] + inner + trailer
                    changed = True
                continue
            if value and not _is_token(value.decode("utf-8", "replace")):
                pieces[index] = piece[: head_end + 4] + self.token(value).encode() + trailer
                changed = True
        return delimiter.join(pieces) if changed else data

    def _foreign(self, content_type: str | None, media: str, charset: str, data: bytes) -> bytes:
        """A JSON or text body in another charset than UTF-8 (`body_b64` would keep it readable to anyone):
        decoded, redacted as UTF-8 and encoded back; a JSON one that cannot be decoded is withheld."""
        try:
            text = data.decode(charset)
        except (LookupError, UnicodeDecodeError):
            return WITHHELD if media in _JSON_TYPES or media.endswith("+json") else data  # untyped: as before
        utf8 = text.encode("utf-8", "surrogatepass")
        redacted = self._body(content_type, media, utf8)
        if redacted == utf8:
            return data
        try:
            return redacted.decode("utf-8", "surrogatepass").encode(charset)
        except (LookupError, UnicodeError):
            return WITHHELD

    def _scrub(self, data: bytes) -> bytes:
        """Textual fallback for JSON that does not parse (truncated, invalid): replace `"name": value`."""
        if self._scrub_re is None:
            return data

        def replace(match: re.Match[bytes]) -> bytes:
            raw = match.group(2)
            inner = raw[1:-1] if raw.startswith(b'"') and raw.endswith(b'"') and len(raw) > 1 else raw
            return match.group(1) + b'"' + self.token(inner).encode() + b'"'

        return self._scrub_re.sub(replace, data)

    # ------------------------------------------------------------------------------------ levels
    def level_for(self, host: str, path: str) -> Level:
        """The first endpoint rule matching host and path (query ignored), else the default level."""
        path = path.split("?", 1)[0] or "/"
        for rule in self.config.endpoints:
            if rule.matches(host, path):
                return rule.level
        return self.config.default_level

    @staticmethod
    def effective(level: Level, *, status: int | None, error: str | None) -> Level:
        """Resolve `on-failure`: full when the call failed (error, or status >= 500), else metadata."""
        if level is not Level.ON_FAILURE:
            return level
        failed = error is not None or (status is not None and status >= 500)
        return Level.FULL if failed else Level.METADATA

    def exchange(
        self,
        *,
        method: str,
        url: str,
        request_headers: HeaderPairs,
        request_body: bytes | None,
        status: int | None = None,
        response_headers: HeaderPairs | None = None,
        response_body: bytes | None = None,
        error: str | None = None,
        level: Level | None = None,
    ) -> tuple[Record, Record | None]:
        """The redacted `request` and `response` objects of an http record, at the endpoint's level.

        `level=None` looks it up from the URL. `status=None` means no response (an error). The
        result goes straight into `record.http_record(request=..., response=...)`.
        """
        if level is None:
            host, path = split_host_path(url)
            level = self.level_for(host, path)
        level = self.effective(level, status=status, error=error)
        keep_headers = level is Level.FULL
        keep_body = level in (Level.FULL, Level.HEADERS_OMITTED)
        limit = self.config.max_body_bytes
        request_pairs = self.headers(request_headers)
        request = http_request(
            method=method,
            url=self.url(url),
            headers=request_pairs if keep_headers else None,
            headers_omitted=None if keep_headers else header_block(request_pairs),
            body=None if request_body is None else self.body(_content_type(request_pairs), request_body),
            keep_body=keep_body,
            max_body_bytes=limit,
        )
        if status is None:
            return request, None
        response_pairs = self.headers(response_headers or ())
        response = http_response(
            status=status,
            headers=response_pairs if keep_headers else None,
            headers_omitted=None if keep_headers else header_block(response_pairs),
            body=None if response_body is None else self.body(_content_type(response_pairs), response_body),
            keep_body=keep_body,
            max_body_bytes=limit,
        )
        return request, response


# ----------------------------------------------------------------------------------------- helpers
def _is_token(text: str) -> bool:
    return text.startswith(TOKEN_PREFIX) and len(text) == len(TOKEN_PREFIX) + 16


def split_host_path(url: str) -> tuple[str, str]:
    """(`host[:port]`, `/path`) of an absolute URL, without user-info, query or fragment."""
    rest = url.split("://", 1)[1] if "://" in url else url
    rest = rest.split("#", 1)[0]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    return authority.rpartition("@")[2], (path.split("?", 1)[0] or "/")


def _strip_port(host: str) -> str:
    if host.startswith("["):  # [v6]:port
        return host.split("]", 1)[0] + "]"
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host


WITHHELD = b"[body withheld by the wire log: its charset could not be decoded to redact it]"


def _foreign_charset(content_type: str | None, data: bytes) -> str | None:
    """The charset of a text body when it is not UTF-8: the content type's `charset`, else what JSON's own
    detection finds (a UTF-16/32 byte-order mark or NUL pattern); None for UTF-8 (the common case)."""
    declared = _declared_charset(content_type)
    if declared is not None:
        return None if declared in _UTF8 else declared
    if b"\x00" not in data[:4] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return None
    detected = json.detect_encoding(data)
    return None if detected in ("utf-8", "utf-8-sig") else detected


@functools.lru_cache(maxsize=256)
def _declared_charset(content_type: str | None) -> str | None:
    """The content type's `charset` parameter, lowercased (None: none); cached like `_media`."""
    match = _CHARSET.search(content_type or "")
    return None if match is None else match.group(1).lower()


def _content_type(pairs: Iterable[list[str]]) -> str | None:
    for name, value in pairs:
        if name.lower() == "content-type":
            return value
    return None


@functools.lru_cache(maxsize=256)
def _media(content_type: str | None) -> str:
    """`application/json; charset=utf-8` -> `application/json` (cached: a face sends a handful of types)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def _maybe_secret_key_re(json_fields: frozenset[str], suffixes: tuple[str, ...]) -> re.Pattern[bytes]:
    """One regex over a JSON body's raw bytes that finds every key that could be secret, so a body
    without a match is kept as is without parsing it (most bodies: the parse and walk cost ~µs each).

    A key is secret when its folded name is a field name, its squashed name ends with a suffix, or its
    parent's name and its own squashed together do (`card` + `number`). In each case the key's last ASCII
    letter or digit (lowercased) is the last one of a field name or a suffix, or the key has none (then the
    parent decides, and the parent is a key this finds). Sound for ASCII bodies without backslashes (no
    `\\u` escape can spell a letter, and only ASCII lowercases to ASCII); `body` checks both first. A key
    is a string followed by `:`, so `<last>[^"a-z0-9]*"\\s*:` (case-insensitive) finds it, and values
    that look like keys only make the check say "maybe"."""
    lasts: set[bytes] = set()
    for name in (*json_fields, *suffixes):
        alnum = squash(name)
        if not alnum:  # a name without letters or digits: any key may be it
            return re.compile(rb'"\s*:')
        lasts.add(alnum[-1].encode())
    if not lasts:
        return re.compile(rb"(?!)")  # nothing is secret
    chars = b"".join(sorted(lasts))
    return re.compile(rb"(?:[" + chars + rb']|")[^"a-z0-9]*"\s*:', re.IGNORECASE)


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # integers beyond 64 bits
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # big integers, NaN: stdlib accepts what orjson refuses (ValueError if not)


def _dumps(document: Any) -> bytes:
    try:
        return orjson.dumps(document)
    except orjson.JSONEncodeError:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass"
        )
