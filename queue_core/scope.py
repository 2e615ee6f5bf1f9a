"""What one admin-route caller may see: its tenant's queues, workers, fences, events and wire-log records.

Every admin route, the control stream and search ask a `Scope` (built from the authenticated key-file
credential) instead of deciding visibility themselves, so the rule lives in one place:

- `admin` and `proxy` credentials see their tenant only: queues `<tenant>.<name>` and `<tenant>_<face>.<name>`
  (shown as `<name>`, and on the admin routes only within the credential's `prefixes`), worker credentials of
  their tenant with their fences and probes, events and wire-log records of their tenant. Another tenant's
  object is reported as not existing (404), never as forbidden, so its name does not leak.
- `operator` credentials span tenants (an explicit key-file role): they see everything and name queues by
  their core name (`t1.orders`, `t1_dedupq.orders`).
- Queues without a tenant (names without '.', which only the queue server's internal API creates: it has
  neither tenants nor authentication) and workers the key file does not know belong to no tenant. Only
  operators see them, unless the app serves an untenanted core (`strictq queue-server`), where every admin
  of its key file does.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from access import permissions, tenancy
from access.keys import Credential, KeyRing
from access.tenancy import FACES, tenant_of  # `?face=` of the admin routes: `queue` or EmoDB's `dedupq`

from .machine import InvalidArgument, QueueNotFound


def internal_name(credential: Credential, name: str, face: str = tenancy.DEFAULT_FACE) -> str:
    """The core's name for a queue the credential names on `face` (access.permissions.queue_name);
    QueueNotFound (404) when it may not use the name: unknown to it means 'does not exist'."""
    internal = permissions.queue_name(credential, name, face)
    if internal is None:
        raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
    return internal


@dataclass(frozen=True, slots=True, eq=False)
class Scope:
    credential: Credential
    keys: KeyRing
    untenanted: bool = False  # queues and workers of no tenant are visible (an untenanted core)

    @property
    def operator(self) -> bool:
        return permissions.spans_tenants(self.credential)

    @property
    def tenant(self) -> str | None:
        """The one tenant this caller sees; None for an operator (every tenant)."""
        return None if self.operator else self.credential.tenant

    @property
    def stream_key(self) -> tuple[str | None, bool]:
        """Subscribers with equal keys see the same control-stream frames (rendered once per key)."""
        return self.tenant, self.untenanted

    # ------------------------------------------------------------------------------------- visibility
    def sees_worker(self, worker: str) -> bool:
        if self.operator:
            return True
        credential = self.keys.by_id(worker)
        if credential is None:
            return self.untenanted
        return credential.tenant == self.credential.tenant

    def sees_queue(self, queue: str, *, prefixes: bool = True) -> bool:
        """Whether the core queue `queue` is this caller's; `prefixes=False` for the control stream,
        whose proxy must know every floor of its tenant's workers."""
        if self.operator:
            return True
        tenant = tenant_of(queue)
        if tenant is None:
            return self.untenanted
        if tenant != self.credential.tenant:
            return False
        return not prefixes or self.credential.may_use(tenancy.split(queue)[1])

    def queue_name(self, queue: str) -> str | None:
        """The caller's name for a core queue, or None when it may not see it."""
        if not self.sees_queue(queue):
            return None
        if self.operator or tenant_of(queue) is None:
            return queue
        return tenancy.split(queue)[1]

    def internal_queue(self, name: str, queues: Container[str], face: str = "queue") -> str:
        """The core's name of an existing queue the caller names; QueueNotFound (404) for anything else,
        another tenant's queue included."""
        if face not in FACES:
            raise InvalidArgument("face must be 'queue' or 'dedupq'", field="face")
        if self.operator:
            if face != "queue":
                raise InvalidArgument(
                    "an operator names queues by their core name (t1_dedupq.orders): leave out face",
                    field="face",
                )
            if name not in queues:
                raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
            return name
        internal = internal_name(self.credential, name, face)  # the name rules and the prefixes
        plain = self.untenanted and face == "queue" and "." not in name
        if internal not in queues and plain and name in queues:
            internal = name  # a queue of the queue server's internal API (no tenant's name lacks '.')
        if internal not in queues:
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        return internal

    def event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """A failure-management event as this caller sees it (queue renamed), or None if not its own.
        An event names a queue, a worker, or (an alert by signature) the tenant it was raised for."""
        if self.operator:
            return event
        tenant = event.get("tenant")
        if tenant is not None and tenant != self.credential.tenant:
            return None
        queue, worker = event.get("queue"), event.get("worker")
        if queue is None and worker is None and tenant is None and not self.untenanted:
            return None  # an event of no tenant (an operator's alert): operators only
        shown = dict(event)
        if queue is not None:
            name = self.queue_name(queue) if isinstance(queue, str) else None
            if name is None:
                return None
            shown["queue"] = name
        if worker is not None and not (isinstance(worker, str) and self.sees_worker(worker)):
            return None
        return shown

    def record(self, record: dict[str, Any]) -> bool:
        """Whether a wire-log record (search) is this caller's: its `tenant` field, written by the gateway,
        the proxy and the core from the credential or queue, must be the caller's. Records without one
        (or of an untenanted queue) are operators' only."""
        if self.operator:
            return True
        if record.get("tenant") != self.credential.tenant:
            return False
        queue = record.get("queue")  # named as the tenant sees it
        return not isinstance(queue, str) or self.credential.may_use(queue)
