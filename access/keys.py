"""Credentials from the key file: who may call the gateway, for which tenant, queues and role.

The key file is TOML (schema in the README)::

    [[credential]]
    id = "AKIDPRODUCER1"          # SQS access key id; also the worker id for role "worker"
    secret = "..."                # SQS secret key; the EmoDB face takes it as X-BV-API-Key
    role = "producer"             # producer | worker | proxy | admin | operator
    tenant = "acme"               # a credential only ever sees its tenant's queues (operator: admin routes
                                  # of every tenant, no data access; access.permissions)
    prefixes = ["orders", "app-"] # queue names it may use ("" = any of the tenant's)
"""

from __future__ import annotations

import hmac
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from wirelog.files import private_dir, write_private

from .tenancy import TENANT_RE

Role = Literal["producer", "worker", "proxy", "admin", "operator"]
# `operator` is the one role that spans tenants, on the admin routes only (never the data faces).
ROLES: tuple[Role, ...] = ("producer", "worker", "proxy", "admin", "operator")
ID_RE = re.compile(r"^[A-Za-z0-9_-]{4,64}$")


class KeyFileError(Exception):
    """The key file is missing, unreadable or malformed; the message names the entry."""


@dataclass(frozen=True, slots=True)
class Credential:
    id: str
    secret: str = field(repr=False)
    role: Role
    tenant: str
    prefixes: tuple[str, ...] = ("",)

    def may_use(self, queue: str) -> bool:
        return any(queue.startswith(prefix) for prefix in self.prefixes)

    @property
    def can_send(self) -> bool:
        return self.role in ("producer", "admin")

    @property
    def can_consume(self) -> bool:
        return self.role in ("worker", "admin")


class KeyRing:
    """Credentials indexed by id (SQS access key) and by secret (EmoDB API key)."""

    def __init__(self, credentials: list[Credential]) -> None:
        self.credentials = credentials
        self._by_id = {c.id: c for c in credentials}
        self._by_secret = {c.secret: c for c in credentials}
        if len(self._by_id) != len(credentials):
            raise KeyFileError("credential ids must be unique")
        if len(self._by_secret) != len(credentials):
            raise KeyFileError("credential secrets must be unique (the EmoDB API key names its credential)")

    def by_id(self, key_id: str) -> Credential | None:
        return self._by_id.get(key_id)

    def by_secret(self, secret: str) -> Credential | None:
        credential = self._by_secret.get(secret)
        # compare_digest keeps the final check constant-time; the dict lookup only narrows the candidate
        if credential is not None and hmac.compare_digest(credential.secret, secret):
            return credential
        return None

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise KeyFileError(f"key file {path} is not valid TOML: {exc}") from exc
        entries = data.get("credential")
        if not isinstance(entries, list) or not entries:
            raise KeyFileError(f"key file {path} has no [[credential]] entries")
        return cls([_credential(entry, index) for index, entry in enumerate(entries)])


def _credential(entry: Any, index: int) -> Credential:
    where = f"credential #{index + 1}"
    if not isinstance(entry, dict):
        raise KeyFileError(f"{where} is not a table")
    key_id, secret, role, tenant = (entry.get(k) for k in ("id", "secret", "role", "tenant"))
    if not isinstance(key_id, str) or not ID_RE.fullmatch(key_id):
        raise KeyFileError(f"{where}: id must be 4-64 letters, digits, '_' or '-'")
    if not isinstance(secret, str) or len(secret) < 16:
        raise KeyFileError(f"{where} ({key_id}): secret must be a string of at least 16 characters")
    if role not in ROLES:
        raise KeyFileError(f"{where} ({key_id}): role must be one of {', '.join(ROLES)}")
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        raise KeyFileError(f"{where} ({key_id}): tenant must be 1-31 lowercase letters, digits or '-'")
    prefixes = entry.get("prefixes", [""])
    if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes) or not prefixes:
        raise KeyFileError(f"{where} ({key_id}): prefixes must be a non-empty list of strings")
    return Credential(key_id, secret, role, tenant, tuple(prefixes))


def new_secret() -> str:
    """A fresh API secret: 24 random bytes as hex, so it never starts with '-' (a command line would read
    `--admin-key -x...` as another option) and needs no quoting in TOML, headers or shells."""
    return secrets.token_hex(24)


def write_development_keys(path: Path, tenant: str = "dev") -> KeyRing:
    """The embedded default's key file: an admin, a producer, three workers and the proxy."""
    names: list[tuple[str, Role]] = [
        ("admin", "admin"),
        ("producer", "producer"),
        ("worker-1", "worker"),
        ("worker-2", "worker"),
        ("worker-3", "worker"),
        ("proxy", "proxy"),
    ]
    credentials = [Credential(name, new_secret(), role, tenant) for name, role in names]
    private_dir(path.parent)
    write_keys(path, credentials, "strictq development credentials (written by `strictq serve`)")
    return KeyRing(credentials)


def write_keys(path: Path, credentials: list[Credential], comment: str = "strictq credentials") -> None:
    """A key file holding `credentials` (every prefix: ""), 0600 from its creation: never a moment
    readable by others, never a chmod after the secrets are in."""
    lines = [f"# {comment}; schema in the README\n"]
    for c in credentials:
        lines.append(
            f'[[credential]]\nid = "{c.id}"\nsecret = "{c.secret}"\nrole = "{c.role}"\n'
            f'tenant = "{c.tenant}"\nprefixes = [""]\n\n'
        )
    write_private(path, "".join(lines))
