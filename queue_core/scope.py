"""The admin routes' `Scope` (access.scope: what one caller may see) with the core's name lookups, which
answer the core's errors: a queue the caller may not use is QueueNotFound (404), never forbidden."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from access import permissions, tenancy
from access.keys import Credential
from access.scope import Scope as VisibilityScope
from access.tenancy import FACES  # `?face=` of the admin routes: `queue` or EmoDB's `dedupq`

from .machine import InvalidArgument, QueueNotFound


def internal_name(credential: Credential, name: str, face: str = tenancy.DEFAULT_FACE) -> str:
    """The core's name for a queue the credential names on `face` (access.permissions.queue_name);
    QueueNotFound (404) when it may not use the name: unknown to it means 'does not exist'."""
    internal = permissions.queue_name(credential, name, face)
    if internal is None:
        raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
    return internal


@dataclass(frozen=True, slots=True, eq=False)
class Scope(VisibilityScope):
    """A caller's visibility plus the lookup of the core queue it names."""

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
