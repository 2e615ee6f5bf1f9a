"""Who may do what on the cluster's JetStream servers: one NATS user per role, not one with every right.

Why a module of its own: the permissions are the contract between what each process of a cluster does on
NATS and what the servers let it do, and they name the cluster's subjects and buckets (cluster.layout), so
they are written from the cluster's id, which `strictq cluster up` fixes before the first node creates
the layout (`cluster` in the credentials file; `ensure_layout` takes it).

- `strictq` (the queue servers, their master, `strictq cluster` commands): every right in the cluster's
  account but the system account's requests (`$SYS.REQ.>`). They create and trim the streams and
  buckets, append partition frames and write the owner map.
- `gateway` (the edges, `strictq serve --cluster`): reads what it needs (KV gets and watches, stream info,
  the floors), writes only the buckets an edge keeps (its traffic reports, and the control and fleet state
  shared by every edge), asks failure management's decider on `sq.<id>.decider.api`, and may not append to
  a partition's stream (a forged frame would be applied by every replica as the owner's), report attempts
  on the health stream or publish events (`sq.<id>.health`, `sq.<id>.events`), write the owner map, the
  nodes', master's, placement, decider lease or layout records, the snapshots, nor create, change, purge
  or delete any stream, nor ask the system account's requests (`$SYS.REQ.>`).
- `system` (account `SYS`, nats-server's system account; cluster.nats_system): asks a server about
  itself (HEALTHZ, JSZ: is JetStream current, who leads the meta group and each stream) instead of the
  HTTP monitoring port, which has no login and so is not opened. Only `cluster up` and the test kit use
  it (`<data-dir>/nats/system.credentials`, 0600); it has no rights in the cluster's account (no stream,
  no bucket, no message).

A gateway's credentials leaking therefore cannot rewrite the queue behind the owners' back; it can still
read what it serves anyway (every message body passes through an edge).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .nats_system import ENDPOINTS

SERVER_USER = "strictq"
GATEWAY_USER = "gateway"
SYSTEM_USER = "system"
SYSTEM_ACCOUNT = "SYS"
# The system account's requests (server and account monitoring, user info): no role of the cluster's
# account needs them, and an account's users are given some (its connections, its statistics) by default.
SYSTEM_REQUESTS = "$SYS.REQ.>"

# JetStream API calls that change streams, consumers' streams or the servers: refused to a gateway.
JS_ADMIN = (
    "$JS.API.STREAM.CREATE.>",
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.STREAM.PEER.>",
    "$JS.API.STREAM.LEADER.>",
    "$JS.API.META.>",
    "$JS.API.ACCOUNT.>",
    "$JS.API.SERVER.>",
)


@dataclass(frozen=True, slots=True)
class RoleLogin:
    user: str
    password: str


def gateway_publish_denied(cluster_id: str, layout_bucket: str) -> list[str]:
    """The subjects a gateway may not publish to (deny wins over any allow in NATS)."""
    prefix = f"sq_{cluster_id}_"
    return [
        # A partition's frames (`sq.<id>.p<K>`: three tokens; the edges only subscribe to the floors,
        # `sq.<id>.floors`, and ask for a floor sync on `sq.<id>.floors.sync`, four tokens).
        f"sq.{cluster_id}.*",
        *(f"$KV.{prefix}{name}.>" for name in ("owners", "nodes", "master", "placement", "decider")),
        f"$KV.{layout_bucket}.>",
        f"$O.{prefix}snapshots.>",
        *JS_ADMIN,
        SYSTEM_REQUESTS,
    ]


def authorization_lines(
    server: RoleLogin,
    gateway: RoleLogin | None,
    cluster_id: str | None,
    layout_bucket: str,
    q: Callable[[str], str],
    system: RoleLogin | None = None,
) -> list[str]:
    """nats-server's `authorization { users: [...] }` block (`q` quotes a string for its config format);
    without a cluster id (a data dir made before roles) or a gateway login, the one server user. With a
    `system` login, also the system account holding it (`accounts`, `system_account`); the users of the
    `authorization` block stay in the global account, where the cluster's streams have always been."""
    server_denied = q(SYSTEM_REQUESTS)
    users = [
        f"    {{user: {q(server.user)}, password: {q(server.password)}, "
        f"permissions: {{publish: {{deny: [{server_denied}]}}}}}}"
    ]
    if gateway is not None and cluster_id is not None:
        denied = ", ".join(q(subject) for subject in gateway_publish_denied(cluster_id, layout_bucket))
        users.append(
            f"    {{user: {q(gateway.user)}, password: {q(gateway.password)}, "
            f"permissions: {{publish: {{deny: [{denied}]}}}}}}"
        )
    lines = ["authorization {", "  users: [", *users, "  ]", "}"]
    if system is not None:
        lines += [
            "accounts {",
            f"  {SYSTEM_ACCOUNT}: {{",
            # Read-only questions to one server and their answers on an inbox: never RELOAD, KICK or
            # lame-duck mode, nor any account's traffic.
            f"    users: [{{user: {q(system.user)}, password: {q(system.password)}, permissions: {{",
            f"      publish: {{allow: [{', '.join(q(f'$SYS.REQ.SERVER.*.{e}') for e in ENDPOINTS)}]}},",
            f"      subscribe: {{allow: [{q('_INBOX.>')}]}}",
            "    }}]",
            "  }",
            "}",
            f"system_account: {SYSTEM_ACCOUNT}",
        ]
    return lines
