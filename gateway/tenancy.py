"""Tenant namespaces: a credential sees only its tenant's queues, under names without the tenant.

Inside the core a queue is `<tenant>.<name>`; tenants never contain '.', so the split is unambiguous.
A queue outside the credential's tenant or prefixes is reported as not existing, so names never leak.
"""

from __future__ import annotations

import re

from queue_core.machine import QueueNotFound

from .keys import Credential

VISIBLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,80}$")


class Forbidden(Exception):
    """The credential's role may not do this (e.g. a producer polling); faces map it to 403."""


def internal_name(credential: Credential, name: str) -> str:
    """The core's name for a queue the credential names; unknown to it means 'does not exist'."""
    if not VISIBLE_NAME_RE.fullmatch(name) or not credential.may_use(name):
        raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
    return f"{credential.tenant}.{name}"


def visible_name(credential: Credential, internal: str) -> str | None:
    tenant, _, name = internal.partition(".")
    if tenant != credential.tenant or not credential.may_use(name):
        return None
    return name


def visible_names(credential: Credential, internals: list[str], prefix: str = "") -> list[str]:
    names = (visible_name(credential, n) for n in internals)
    return [n for n in names if n is not None and n.startswith(prefix)]


def require(credential: Credential, allowed: bool, action: str) -> None:
    if not allowed:
        raise Forbidden(f"credential {credential.id!r} (role {credential.role}) may not {action}")
