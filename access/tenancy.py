"""The tenancy rule, the one copy: how a tenant's queue is named inside the core.

A credential sees only its tenant's queues, under names without the tenant. Inside the core a queue is
`<tenant>.<name>` (the queue face's namespace, shared by EmoDB `/queue/1` and SQS) or `<tenant>_dedupq.<name>`
(EmoDB's dedup queues). Tenants match `TENANT_RE`: never '.' nor '_', so the split is unambiguous. Names
without '.' belong to no tenant: only the queue server's internal API (no tenants) creates them.

Pure and standard-library only: the sans-I/O machine (shared failure signatures per tenant), the admin scope,
the faces, the egress proxy and the replay runner all call these functions instead of splitting names.
"""

from __future__ import annotations

import re

TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
VISIBLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,80}$")  # a queue name as a tenant writes it

# The faces whose namespaces a tenant has, and the suffix each adds to the tenant inside the core.
FACE_SUFFIXES = {"queue": "", "dedupq": "_dedupq"}
FACES = tuple(FACE_SUFFIXES)
DEFAULT_FACE = "queue"


def namespace(tenant: str, face: str = DEFAULT_FACE) -> str:
    """The core's namespace of a tenant's face: `t1`, `t1_dedupq`. KeyError for an unknown face."""
    return tenant + FACE_SUFFIXES[face]


def core_name(tenant: str, name: str, face: str = DEFAULT_FACE) -> str:
    """The core's name of the tenant's queue `name` on `face`: `t1.orders`, `t1_dedupq.orders`."""
    return f"{namespace(tenant, face)}.{name}"


def split(queue: str) -> tuple[str | None, str]:
    """(namespace, name) of a core queue: `t1_dedupq.orders` -> ("t1_dedupq", "orders"); a name without '.'
    has no namespace: `jobs` -> (None, "jobs")."""
    space, dot, name = queue.partition(".")
    return (space, name) if dot else (None, queue)


def tenant_of(queue: str) -> str | None:
    """The tenant a core queue belongs to: `t1.orders` and `t1_dedupq.orders` -> "t1"; None without '.'."""
    space, _ = split(queue)
    return None if space is None else space.partition("_")[0]


def valid_name(name: str) -> bool:
    """Whether `name` may name a queue on the faces (letters, digits, `_.-`, 1-80 characters)."""
    return VISIBLE_NAME_RE.fullmatch(name) is not None


def name_in(tenant: str, queue: str, face: str = DEFAULT_FACE) -> str | None:
    """The tenant's name of the core queue `queue` on `face`, or None when it is not in that namespace."""
    space, name = split(queue)
    return name if space is not None and space == namespace(tenant, face) else None
