"""The internal API as one table: every operation a queue server serves to its gateways and tools.

Why one table: the server (queue_core.server, admin_internal, fleet_http) and its clients
(queue_core.remote.RemoteQueueService, queue_core.client.QueueClient, through queue_core.internal_client)
used to spell each path and body twice, and a cluster's way of serving each call lived only in
cluster/backend.py. Here each operation is named once with its method, its path template, its request
encoder and answer decoder (the codecs of queue_core.wire: no format of its own) and how a cluster serves
it (`Serving`). The server mounts the table's routes with handlers keyed by operation name; the clients
build every request with `Operation.bind` and read every answer with the operation's decoder; the test
tests/test_operations_table.py holds the three to it. docs/contracts.md points here as the reference.

Not in the table: the routes a queue server shares with every gateway and which authenticate each caller
with the key file (`/admin/...`, `/metrics`: queue_core.internal_auth.KEYED_PREFIXES). They are the public
admin API (docs/admin-api.md), not the internal one.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

from . import figures as figures_wire
from . import wire
from .fences import Fence
from .figures import Figures
from .machine import (
    AckOutcome,
    NotFound,
    PeekItem,
    QueueError,
    SendRequest,
    SendResult,
)
from .machine.capabilities import PLAIN, Capabilities
from .machine.core import RenewMode
from .machine.handover import HandoverPolicy
from .machine.inputs import AttemptResult
from .machine.records import Received
from .machine.routing import VersionFigures

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Serving(enum.Enum):
    """How a cluster (cluster/backend.py) serves an operation over its partitions."""

    GROUP = "by group"  # on the group's partition (a core-named group, which shows none: every partition)
    MESSAGE = "by message"  # on the partition the message id or receipt was learned in or shows
    FAN_OUT = "fan out"  # on every partition at once, the answers merged (sums, unions, one move's parts)
    ANY = "any partition"  # every partition holds the same answer (queue metadata): the nearest one
    CLUSTER = "once"  # control state stored once for the whole cluster (not per partition)
    NODE = "per node"  # each node answers for itself (liveness, readiness): never routed to a partition


@dataclass(slots=True)  # not frozen: one is made per request, and frozen dataclasses are slower to make
class Request:
    """What a client sends: the path template's values, the query and the JSON body (None: no body)."""

    path: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str | int] | None = None
    body: Any = None


@dataclass(frozen=True, slots=True)
class Operation[**P, R]:
    """One operation of the internal API. `encode`: a client's typed arguments as a `Request`; `decode`:
    the server's JSON answer as the typed value. `batch`: a 4xx that still carries per-item results (every
    item failed) is an answer, not an error. `passed_on`: a 4xx is handed to the gateway's caller as the
    queue server gave it (its admin state: queue_core.health_view, queue_core.fleet_remote), not mapped to
    a core error."""

    name: str
    method: str
    path: str
    serving: Serving
    encode: Callable[P, Request]
    decode: Callable[[Any], R]
    batch: bool = False
    passed_on: bool = False
    doc: str = ""

    def bind(self, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        """This operation with its arguments, ready for a client's one call path."""
        return Call(self, self.encode(*args, **kwargs))

    def raw(self, path: Mapping[str, str] | None = None, body: Any = None, **query: str | int) -> Call[Any]:
        """A request built by the caller (QueueClient: its callers' JSON as they gave it), answered as the
        server's JSON: the table's method and path, without the typed codecs."""
        return Call(self, Request(path or {}, query or None, body))

    def target(self, values: Mapping[str, str]) -> str:
        """The path with each `{name}` filled in as one quoted segment (every `/` quoted)."""
        if not values:
            return self.path
        return self.path.format_map({name: quote(value, safe="") for name, value in values.items()})


@dataclass(slots=True)  # not frozen, as Request
class Call[R]:
    """An operation bound to its request: what the clients' one call path sends and decodes."""

    operation: Operation[..., R]
    request: Request

    @property
    def path(self) -> str:
        return self.operation.target(self.request.path)


# ------------------------------------------------------------------------------------- encoders
def _nothing() -> Request:
    return Request()


def _queue(queue: str) -> Request:
    return Request({"queue": queue})


def _group(queue: str, group: str) -> Request:
    return Request({"queue": queue}, {"group": group})


def _body(body: dict[str, Any]) -> Request:
    return Request(body=body)


def _move(move_id: str) -> Request:
    """A move reference as one path segment: never `.` or `..`, which quoting keeps and the URL would
    resolve (`/v1/moves/..` is `/v1/`): such a reference is no move, as locally."""
    if move_id in ("", ".", ".."):
        raise NotFound(f"no move {move_id!r}", reference=move_id)
    return Request({"move": move_id})


def _create(queue: str, attributes: dict[str, Any] | None = None) -> Request:
    return Request({"queue": queue}, body={"attributes": attributes or {}})


def _patch(queue: str, changes: dict[str, Any]) -> Request:
    return Request({"queue": queue}, body={"attributes": changes})


def _list(prefix: str = "") -> Request:
    return Request(query={"prefix": prefix})


def _group_metrics(queue: str, group: str) -> Request:
    return Request({"queue": queue}, {"name": group})


def _figures(top: int) -> Request:
    return Request(query={"top": top})


def _send(queue: str, requests: Sequence[SendRequest], create: bool = False) -> Request:
    return Request({"queue": queue}, body=wire.encode_send(requests, create))


def _receive(
    queue: str,
    limit: int = 10,
    ttl: float | None = None,
    worker: str = "",
    wait: float = 0.0,
    probes: bool = True,
    capabilities: Capabilities = PLAIN,
) -> Request:
    polled = wire.ReceiveRequest(limit, ttl, worker, wait, probes, capabilities)
    return Request({"queue": queue}, body=wire.encode_receive(polled))


def _wait(queue: str, timeout: float, worker: str = "") -> Request:
    return Request({"queue": queue}, body={"timeout": timeout, "worker": worker})


def _claims(queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None) -> Request:
    return Request({"queue": queue}, body=wire.encode_claims(items, holder))


def _renew(
    queue: str,
    items: Sequence[tuple[str, int | None]],
    ttl: float,
    mode: RenewMode = "extend",
    holder: str | None = None,
) -> Request:
    return Request({"queue": queue}, body=wire.encode_claims(items, holder, ttl=ttl, mode=mode))


def _report(queue: str, worker: str, results: Sequence[AttemptResult], holder: str | None = None) -> Request:
    return Request({"queue": queue}, body=wire.encode_report(worker, results, holder))


def _peek(queue: str, limit: int = 10) -> Request:
    return Request({"queue": queue}, {"limit": limit})


def _set_policy(queue: str, group: str, override: dict[str, Any] | None) -> Request:
    return Request({"queue": queue}, {"group": group}, {"override": override})


def _group_log(queue: str, group: str, limit: int = 50) -> Request:
    return Request({"queue": queue}, {"group": group, "limit": str(limit)})


def _hand_over(
    queue: str, groups: Sequence[str] | None, from_worker: str, policy: HandoverPolicy | None = None
) -> Request:
    body = {"from": from_worker, "groups": None if groups is None else list(groups), "policy": policy}
    return Request({"queue": queue}, body=body)


def _release_handover(queue: str, groups: Sequence[str]) -> Request:
    return Request({"queue": queue}, body={"groups": list(groups)})


def _put_state(queue: str, worker: str, states: dict[str, Any]) -> Request:
    return Request({"queue": queue}, body={"worker": worker, "states": states})


def _version_figures(queue: str, recent: float) -> Request:
    return Request({"queue": queue}, {"recent": str(recent)})


def _start_move(source: str, destination: str, move_id: str | None = None) -> Request:
    return Request(body=wire.encode_move_request(source, destination, move_id))


def _put_fence(worker: str, mode: str, reason: str, ttl: float | None) -> Request:
    return Request({"worker": worker}, body={"mode": mode, "reason": reason, "ttl": ttl})


def _delete_fence(worker: str, reason: str) -> Request:
    return Request({"worker": worker}, {"reason": reason})


def _failures(events: int, since: int | None = None) -> Request:
    return Request(query={"events": str(events), **({} if since is None else {"since": str(since)})})


def _queue_reason(queue: str, reason: str) -> Request:
    return Request(body={"queue": queue, "reason": reason})


def _event(event: str, reason: str, queue: str) -> Request:
    return Request(body={"event": event, "reason": reason, "queue": queue})


def _worker(worker: str) -> Request:
    return Request(body={"worker": worker})


def _fleet_targets(queue: str, version: str | None) -> Request:
    return Request(body={"queue": queue, "version": version})


def _fleet_control(kind: Any, args: Any, workers: Sequence[str], ttl: Any, queue: str | None) -> Request:
    return Request(body={"kind": kind, "args": args, "workers": list(workers), "ttl": ttl, "queue": queue})


def _fleet_policy(queue: str, policy: dict[str, Any]) -> Request:
    return Request({"queue": queue}, body=policy)


# ------------------------------------------------------------------------------------- decoders
def _json(payload: Any) -> dict[str, Any]:
    return payload if isinstance(payload, dict) else {}


def _ignored(payload: Any) -> None:
    return None


def _queues(payload: Any) -> list[str]:
    return list(payload["queues"])


def _send_results(payload: Any) -> list[SendResult | QueueError]:
    return [wire.decode_send_result(item) for item in payload["results"]]


@dataclass(frozen=True, slots=True)
class Polled:
    """A receive's answer: the messages, and the groups the server asks this donor to upload now (state
    transfer; a remote backend hands them out through `export_requests`)."""

    messages: list[Received]
    exports: list[str]


def _polled(payload: Any) -> Polled:
    exports = payload.get("exports")
    named = [str(group) for group in exports] if isinstance(exports, list) else []
    return Polled([wire.decode_received(item) for item in payload["messages"]], named)


def _ready(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("ready") is True


def _outcomes(payload: Any) -> list[AckOutcome]:
    return [wire.decode_ack_outcome(item) for item in payload["results"]]


def _report_outcomes(payload: Any) -> list[AckOutcome]:
    return [wire.decode_report_outcome(item) for item in payload["results"]]


def _count(key: str) -> Callable[[Any], int]:
    def decode(payload: Any) -> int:
        return int(payload[key])

    return decode


def _peeked(payload: Any) -> list[tuple[PeekItem, bytes, str, bytes]]:
    return [wire.decode_peek(item) for item in payload["messages"]]


def _strings(key: str) -> Callable[[Any], list[str]]:
    def decode(payload: Any) -> list[str]:
        return [str(item) for item in payload[key]]

    return decode


def _rows(key: str) -> Callable[[Any], list[dict[str, Any]]]:
    def decode(payload: Any) -> list[dict[str, Any]]:
        return list(payload[key])

    return decode


def _handed_over(payload: Any) -> tuple[list[str], list[str]]:
    return list(payload["groups"]), list(payload["already"])


def _state_results(payload: Any) -> dict[str, str]:
    return {str(group): str(status) for group, status in payload["results"].items()}


def _fences(payload: Any) -> list[Fence]:
    return [Fence.from_dict(item) for item in payload["fences"]]


def _figures_answer(payload: Any) -> Figures:
    return figures_wire.decode(payload)


# ---------------------------------------------------------------------------------------- the table
Q = "/v1/queues/{queue}"
G, M, F, A, C, N = (
    Serving.GROUP,
    Serving.MESSAGE,
    Serving.FAN_OUT,
    Serving.ANY,
    Serving.CLUSTER,
    Serving.NODE,
)

# Liveness and readiness: open to probes without the secret (queue_core.internal_auth.OPEN_PATHS).
HEALTHZ = Operation("healthz", "GET", "/healthz", N, _nothing, _json, doc="the process answers")
READYZ = Operation("readyz", "GET", "/readyz", N, _nothing, _ready, doc="its store is open: 200, else 503")

# Queues: created, changed and deleted on every partition; read from any one (each holds every queue).
LIST_QUEUES = Operation("list_queues", "GET", "/v1/queues", A, _list, _queues)
CREATE_QUEUE = Operation("create_queue", "PUT", Q, F, _create, wire.decode_attributes, doc="idempotent")
GET_QUEUE = Operation(
    "get_queue", "GET", Q, F, _queue, wire.decode_queue_info,
    doc="attributes, metrics, created_at: the metrics summed over partitions, the rest any one's",
)  # fmt: skip
SET_ATTRIBUTES = Operation("set_attributes", "PATCH", Q, F, _patch, wire.decode_attributes)
DELETE_QUEUE = Operation("delete_queue", "DELETE", Q, F, _queue, _ignored)

# Messages. A send goes by its group; claims by their message ids; receive passes over the partitions.
SEND = Operation("send", "POST", Q + "/send", G, _send, _send_results, batch=True)
RECEIVE = Operation(
    "receive", "POST", Q + "/receive", F, _receive, _polled,
    doc="cluster: passes over the partitions from a rotating start, answers interleaved",
)  # fmt: skip
WAIT_READY = Operation(
    "wait_ready", "POST", Q + "/wait", F, _wait, _ready,
    doc="a cluster gateway's long poll of a partition: ready or not, claims nothing",
)  # fmt: skip
ACK = Operation("ack", "POST", Q + "/ack", M, _claims, _outcomes, batch=True)
REPORT = Operation("report", "POST", Q + "/results", M, _report, _report_outcomes, doc="always 200")
RENEW = Operation("renew", "POST", Q + "/renew", M, _renew, _outcomes, batch=True)
RELEASE = Operation("release", "POST", Q + "/release", M, _claims, _outcomes, batch=True)
UNCLAIM_ALL = Operation("unclaim_all", "POST", Q + "/unclaimall", F, _queue, _count("released"))
PURGE = Operation("purge", "POST", Q + "/purge", F, _queue, _count("purged"))
PEEK = Operation("peek", "GET", Q + "/peek", F, _peek, _peeked, doc="cluster: oldest first over partitions")
SIZE = Operation("size", "GET", Q + "/size", F, _queue, _count("size"), doc="EmoDB's size: always exact")
CLAIM_COUNT = Operation("claim_count", "GET", Q + "/claimcount", F, _queue, _count("claimcount"))
GROUP_METRICS = Operation(
    "group_metrics", "GET", Q + "/group", G, _group_metrics, _json,
    doc="the group in the query (?name=): group ids may hold '/', '?' or '#'",
)  # fmt: skip
FIGURES = Operation(
    "figures", "GET", "/v1/figures", F, _figures, _figures_answer,
    doc="every queue's figures (dashboard, /metrics); cluster: per partition with its owner, and summed",
)  # fmt: skip

# The retry workflow (docs/failure-management.md §2): by the group's partition (?group=).
RELEASE_GROUP = Operation("release_group", "POST", Q + "/groups/release", G, _group, _count("released"))
REDRIVE_GROUP = Operation("redrive_group", "POST", Q + "/groups/redrive", G, _group, wire.decode_redriven)
GROUP_POLICY = Operation("group_policy", "GET", Q + "/groups/policy", G, _group, wire.decode_group_policy)
SET_GROUP_POLICY = Operation(
    "set_group_policy", "PUT", Q + "/groups/policy", G, _set_policy, wire.decode_group_policy
)
GROUP_LOG = Operation("group_log", "GET", Q + "/groups/log", G, _group_log, _rows("attempts"))
PARKED_GROUPS = Operation("parked_groups", "GET", Q + "/parked", F, _queue, _strings("groups"))

# Handovers and state transfer (docs/state-transfer.md); group routing's figures (docs/rollouts.md).
HAND_OVER = Operation(
    "hand_over", "POST", Q + "/handover", G, _hand_over, _handed_over,
    doc="named groups on their partitions; `groups: null` (every group of the donor) on every one",
)  # fmt: skip
RELEASE_HANDOVER = Operation(
    "release_handover", "POST", Q + "/handover/release", G, _release_handover, _strings("released")
)
HANDOVERS = Operation("handovers", "GET", Q + "/handover", F, _queue, _rows("handovers"))
PUT_STATE = Operation("put_state", "PUT", Q + "/state", G, _put_state, _state_results)
VERSION_FIGURES = Operation(
    "version_figures", "GET", Q + "/routing/figures", F, _version_figures, VersionFigures.from_json
)

# Moves between queues: one move over every partition under one id (a group stays in its partition).
START_MOVE = Operation("start_move", "POST", "/v1/moves", F, _start_move, wire.decode_move)
MOVE_STATUS = Operation("move_status", "GET", "/v1/moves/{move}", F, _move, wire.decode_move)
CANCEL_MOVE = Operation("cancel_move", "POST", "/v1/moves/{move}/cancel", F, _move, wire.decode_move)

# A queue server's admin state, every tenant's by core names, for the gateway in front of it, which cuts
# each answer to its caller's scope (queue_core.admin_internal, queue_core.health_view,
# queue_core.fleet_remote); its 4xx are passed on as they are. A cluster keeps this state once for the
# cluster (control buckets, the decider).
CONTROL = Operation(
    "control", "GET", "/v1/admin/control", C, _nothing, _ignored, passed_on=True,
    doc="the control stream as server-sent events: read as a stream (RemoteQueueService.control_events)",
)  # fmt: skip
FENCES = Operation("fences", "GET", "/v1/admin/fences", C, _nothing, _fences, passed_on=True)
PUT_FENCE = Operation(
    "put_fence", "PUT", "/v1/admin/fences/{worker}", C, _put_fence, Fence.from_dict, passed_on=True
)
DELETE_FENCE = Operation(
    "delete_fence", "DELETE", "/v1/admin/fences/{worker}", C, _delete_fence, Fence.from_dict, passed_on=True
)
FAILURES = Operation(
    "failures", "GET", "/v1/admin/failures", C, _failures, _json, passed_on=True,
    doc="failure management's status document, the events after `since` and the probes out",
)  # fmt: skip
SUSPEND = Operation("suspend", "POST", "/v1/admin/failures/suspend", C, _queue_reason, _json, passed_on=True)
RESUME = Operation("resume", "POST", "/v1/admin/failures/resume", C, _queue_reason, _json, passed_on=True)
UNBLACKLIST = Operation(
    "unblacklist", "POST", "/v1/admin/failures/unblacklist", C, _worker, _json, passed_on=True
)
ALERT = Operation("alert", "POST", "/v1/admin/failures/alert", C, _body, _json, passed_on=True)
RECORD_EVENT = Operation(
    "record_event", "POST", "/v1/admin/failures/record", C, _event, _json, passed_on=True,
    doc="an event decided at the edge (a rollout's step) into failure management's events, durable on answer",
)  # fmt: skip
FLEET = Operation("fleet", "GET", "/v1/admin/fleet", C, _nothing, _json, passed_on=True)
FLEET_TARGETS = Operation(
    "fleet_targets", "POST", "/v1/admin/fleet/targets", C, _fleet_targets, _json, passed_on=True
)
FLEET_CONTROL = Operation(
    "fleet_control", "POST", "/v1/admin/fleet/control", C, _fleet_control, _json, passed_on=True
)
PUT_FLEET_POLICY = Operation(
    "put_fleet_policy", "PUT", "/v1/admin/fleet/policies/{queue}", C, _fleet_policy, _json, passed_on=True
)
DELETE_FLEET_POLICY = Operation(
    "delete_fleet_policy", "DELETE", "/v1/admin/fleet/policies/{queue}", C, _queue, _json, passed_on=True
)
FLEET_HEARTBEAT = Operation(
    "fleet_heartbeat", "POST", "/v1/fleet/heartbeat", C, _body, _json,
    doc="a worker's heartbeat a gateway forwards (queue_core.fleet_remote), queues by core names",
)  # fmt: skip

# Every operation above, in the order written (the server mounts them so: same paths stay together).
OPERATIONS: tuple[Operation[..., Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Operation)
)
BY_NAME: dict[str, Operation[..., Any]] = {op.name: op for op in OPERATIONS}


# ------------------------------------------------------------------------------- the port's methods
@dataclass(frozen=True, slots=True)
class PortMethod:
    """A `QueueBackend` method's operation; `serving`: set where the method reads less of the answer
    than the operation gives, so a cluster serves it otherwise (attributes: any partition's)."""

    operation: str
    serving: Serving | None = None


# Every QueueBackend method (queue_core.backend) that crosses the wire, and its operation.
SAME_NAMED = (
    "create_queue", "set_attributes", "delete_queue", "list_queues", "group_metrics", "figures", "send",
    "receive", "ack", "renew", "release", "report", "unclaim_all", "purge", "peek", "start_move",
    "move_status", "cancel_move", "release_group", "redrive_group", "parked_groups", "group_policy",
    "set_group_policy", "group_log", "hand_over", "release_handover", "handovers", "version_figures",
    "put_state",
)  # fmt: skip
PORT: dict[str, PortMethod] = {
    **{name: PortMethod(name) for name in SAME_NAMED},
    "attributes": PortMethod("get_queue", Serving.ANY),
    "created_at": PortMethod("get_queue", Serving.ANY),
    "metrics": PortMethod("get_queue"),
    "healthy": PortMethod("readyz"),  # as of the client's last probe of /readyz
}

# The QueueBackend members that never cross the wire, and why.
LOCAL_ONLY: dict[str, str] = {
    "partitions": "the backend's own setting (how many groups' partitions it hashes to)",
    "dedup_reach": "what the backend's topology is, not a question to a server",
    "start": "opens the client's own session and its readiness probe",
    "stop_waiting": "ends the client's own long polls in flight",
    "close": "closes the client's own session",
    "export_requests": "taken from the last receive's answer (`exports`), no call of its own",
}


def serving_of(method: str) -> Serving:
    """How a cluster serves the port's `method`."""
    port = PORT[method]
    return port.serving or BY_NAME[port.operation].serving


def add_routes(app: web.Application, handlers: Mapping[str, Handler]) -> None:
    """Mount `handlers` (operation name -> handler) on `app` at their operations' methods and paths. GET
    also answers HEAD, as aiohttp's `add_get` always did here."""
    for name, handler in handlers.items():
        operation = BY_NAME[name]  # KeyError: a handler of no operation of the table
        if operation.method == "GET":
            app.router.add_get(operation.path, handler)
        else:
            app.router.add_route(operation.method, operation.path, handler)
