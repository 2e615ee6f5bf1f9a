"""Roles and what each may do: the one copy of the role checks of the data faces, the admin routes and the
egress proxy, and of what a credential sees of the core's queues (its tenant's, within its prefixes).

Roles (`access.keys.ROLES`): `producer` sends, `worker` consumes, `admin` does both and administers its
tenant, `proxy` is the egress proxy's identity (the control stream only), `operator` spans tenants on the
admin routes and never touches data.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from protocol import errors

from . import tenancy
from .keys import Credential, Role

OPERATOR: Role = "operator"  # the one role that spans tenants (admin routes only)

# The data faces (SQS, EmoDB): what a call needs. `read` lists and describes queues; `create` makes one
# (producers create queues, as the EmoDB face does on first send); `admin` purges, moves, peeks, tags.
Permission = Literal["read", "create", "send", "consume", "admin"]

# The admin routes (queue_core.admin_http, health_http, retry_http, spark's search): who may call them.
# The proxy needs the control stream (fences, floors, probes) only.
STREAM_ROLES: tuple[Role, ...] = ("proxy", "admin", "operator")
READ_ROLES: tuple[Role, ...] = ("admin", "operator")
WRITE_ROLES: tuple[Role, ...] = ("admin", "operator")
CONTROL_ROLES = STREAM_ROLES  # what the egress proxy may read the control stream with

# The egress proxy: whose calls it forwards (Proxy-Authorization).
PROXY_CALL_ROLES: frozenset[Role] = frozenset({"worker", "admin"})


class Forbidden(errors.Forbidden):
    """The credential's role may not do this (e.g. a producer polling): 403 `forbidden` (protocol.errors)."""


def allowed(credential: Credential, permission: Permission) -> bool:
    """Whether the credential's role grants `permission` on the data faces."""
    if permission == "read":
        return credential.role in ("producer", "worker", "admin")
    if permission in ("send", "create"):
        return credential.can_send
    if permission == "consume":
        return credential.can_consume
    return credential.role == "admin"


def require(credential: Credential, ok: bool, action: str) -> None:
    """Forbidden (403) naming the credential and its role unless `ok`."""
    if not ok:
        raise Forbidden(f"credential {credential.id!r} (role {credential.role}) may not {action}")


def spans_tenants(credential: Credential) -> bool:
    """An `operator` sees every tenant on the admin routes; everyone else sees its own."""
    return credential.role == OPERATOR


def tenants_of(credentials: Iterable[Credential]) -> set[str]:
    """The tenants a key file serves: those of its credentials that do not span tenants."""
    return {c.tenant for c in credentials if not spans_tenants(c)}


def fenceable(credential: Credential) -> bool:
    """Whether a fence may name the credential: a `worker`'s outbound calls are the ones fenced (its id is
    the worker id of its claims and of the egress proxy's fences)."""
    return credential.role == "worker"


def ends_any_claim(credential: Credential) -> bool:
    """Whether the credential may ack or renew a claim that went to someone else (EmoDB's admin, by id);
    others end or extend only their own claims."""
    return allowed(credential, "admin")


def egress_identity(credential: Credential) -> bool:
    """Whether the credential is the egress proxy's own identity: the one it reads the control stream with
    unless told another (`--control-key-id`)."""
    return credential.role == "proxy"


def queue_name(credential: Credential, name: str, face: str = tenancy.DEFAULT_FACE) -> str | None:
    """The core's name of the queue the credential names on `face`, or None when the name is malformed or
    outside its prefixes (callers report that as 'does not exist', so names never leak)."""
    if not tenancy.valid_name(name) or not credential.may_use(name):
        return None
    return tenancy.core_name(credential.tenant, name, face)


def visible_name(credential: Credential, queue: str, face: str = tenancy.DEFAULT_FACE) -> str | None:
    """The credential's name of the core queue `queue` on `face`, or None when it may not see it."""
    name = tenancy.name_in(credential.tenant, queue, face)
    return name if name is not None and credential.may_use(name) else None


def visible_names(
    credential: Credential, queues: list[str], prefix: str = "", face: str = tenancy.DEFAULT_FACE
) -> list[str]:
    names = (visible_name(credential, q, face) for q in queues)
    return [n for n in names if n is not None and n.startswith(prefix)]


def sets_limits(credential: Credential, credentials: Iterable[Credential]) -> bool:
    """Whether the credential may change a tenant's send limit (gateway.limits_http): an `operator`, or
    the `admin` of a key file that serves one tenant only (the embedded default, whose admin is the
    operator). With several tenants a tenant's admin must not raise its own limit."""
    if spans_tenants(credential):
        return True
    return credential.role == "admin" and tenants_of(credentials) == {credential.tenant}
