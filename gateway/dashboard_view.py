"""What the operator's dashboard shows one caller, within its scope (queue_core.scope): plain data for the
templates, read from the queues' figures (through the backend port: queue_core.figures), the control hub
and failure management where this gateway has them, and a cluster's partitions (gateway.cluster_figures),
never from another tenant. What a topology does not have here is None: its section says so.

Queues are named as the caller names them on the admin routes (an admin: `orders`, plus `face` for an
EmoDB dedup queue; an operator: the core name `t1.orders`), so the page's actions call those routes with
the names shown. Every list is capped (`MAX_ROWS`) so a large deployment gives a page of bounded size;
the page says when rows were left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from access.keys import KeyRing
from access.permissions import fenceable
from queue_core.control import ControlHub
from queue_core.figures import Figures, QueueFigures
from queue_core.health_view import ErrorCases
from queue_core.metrics_export import queue_labels
from queue_core.scope import Scope
from wirelog.times import format_time

from .cluster_figures import ClusterFigures
from .dashboard_history import BacklogHistory, sparkline

MAX_ROWS = 200  # queues, workers, groups, parked groups and error cases shown at most
MAX_PARKED_PER_QUEUE = 50
EVENTS = 20
CHART = (160.0, 28.0)  # width, height of a backlog-age chart
HEALTH_FENCE = "health: "  # failure management's fences carry this reason prefix (queue_core.failures)


@dataclass(slots=True)
class Action:
    """A button of the page: what it asks for confirmation, and the admin route it calls."""

    kind: str  # fence | unfence | lift | suspend | resume | release
    label: str
    title: str  # the confirmation's question
    method: str
    path: str  # the admin route, path and query, escaped
    fields: str = ""  # what the confirmation asks: "reason", "mode ttl reason"
    danger: bool = False


@dataclass(slots=True)
class QueueRow:
    name: str  # as the caller names it
    tenant: str
    face: str
    visible: int
    in_flight: int
    delayed: int
    groups: int
    oldest_age: float
    unattempted_age: float
    suspended: bool
    parked: int
    chart: str  # polyline points of the oldest-message age
    chart_unattempted: str
    chart_max: float
    samples: int
    actions: list[Action] = field(default_factory=list)


@dataclass(slots=True)
class GroupRow:
    queue: str
    group: str
    messages: int
    oldest_age: float


@dataclass(slots=True)
class WorkerRow:
    worker: str
    state: str  # healthy | suspect | fenced | probing | blacklisted
    failures: int
    queue: str | None
    reason: str | None
    fence: str | None  # "block, by an operator: trying fences, until ..."
    until: str | None
    actions: list[Action] = field(default_factory=list)


@dataclass(slots=True)
class View:
    who: str
    tenant: str | None  # None: an operator (every tenant)
    operator: bool
    now: str
    queues: list[QueueRow]
    queues_hidden: int
    groups: list[GroupRow]
    workers: list[WorkerRow]
    workers_hidden: int
    suspended: list[dict[str, Any]]
    parked: list[dict[str, Any]]
    parked_hidden: int
    errors: dict[str, Any]
    events: list[dict[str, Any]]
    health: bool  # failure management runs
    index: bool  # a search index is built
    counts: dict[str, int]
    fences: bool = True  # this gateway holds the fences (False: a gateway in front of a queue server)
    missing: tuple[int, ...] = ()  # cluster partitions whose figures did not come (left out)
    unreachable: str | None = None  # why no figures came at all
    cluster: ClusterFigures | None = None  # a cluster's partitions, owners and standbys (operators)
    cluster_error: str | None = None  # why the cluster's state could not be read


def build_view(
    scope: Scope,
    figures: Figures,
    hub: ControlHub | None,
    keys: KeyRing,
    status: dict[str, Any] | None,
    failures: ErrorCases | None,
    history: BacklogHistory,
    error_cases: dict[str, Any] | None,
    index_ready: bool,
    *,
    allowed: frozenset[str] = frozenset(),
    cluster: ClusterFigures | None = None,
    cluster_error: str | None = None,
    unreachable: str | None = None,
) -> View:
    """`allowed`: the kinds of action whose admin route this gateway serves (the others' buttons are
    left out); `cluster`: shown to operators only (it spans tenants). `status`: failure management's
    document as the caller sees it (None: not running, or out of reach); `failures`: its error cases."""
    now = figures.at
    suspended_by_name = {
        q["queue"]: q for q in (status["queues"] if status is not None else []) if q.get("suspended")
    }
    found = [q for q in figures.queues if scope.sees_queue(q.name)] if figures.ready else []
    # The queues with the oldest backlog first: what an operator looks for.
    found.sort(key=lambda q: (-q.gauges.oldest_age, q.name))
    queues = [_queue_row(scope, q, suspended_by_name, history, allowed) for q in found[:MAX_ROWS]]
    groups = sorted(
        (
            GroupRow(_shown(scope, q.name), group.name, group.messages, group.oldest_age)
            for q in found
            for group in q.gauges.top_groups
        ),
        key=lambda r: (-r.oldest_age, r.queue, r.group),
    )[:MAX_ROWS]
    workers = _workers(scope, hub, keys, status, figures, allowed)
    parked, parked_hidden = _parked(scope, found, allowed)
    # Failure management's own list where it runs beside this gateway; else the queues the figures report
    # suspended (by the queue server's or the partitions' failure management: since when, why not known).
    for q in found:
        name = _shown(scope, q.name)
        visible = scope.operator or queue_labels(q.name)[1] == "queue"
        if q.suspended and visible and name not in suspended_by_name:
            suspended_by_name[name] = {"queue": name, "suspended": True, "manual": None}
    suspended = [
        {
            **q,
            "since_text": format_time(q.get("since")),
            "actions": _only([_resume(scope, q["queue"])], allowed),
        }
        for q in suspended_by_name.values()
    ]
    events = list(reversed(status["events"])) if status is not None else []
    for event in events:
        event["at_text"] = format_time(event.get("at"))
    errors = _errors(scope, failures, error_cases, now)
    held = sum(1 for w in workers if w.state in ("fenced", "probing", "blacklisted"))
    return View(
        who=scope.credential.id,
        tenant=scope.tenant,
        operator=scope.operator,
        now=format_time(now),
        queues=queues,
        queues_hidden=max(0, len(found) - MAX_ROWS),
        groups=groups,
        workers=workers[:MAX_ROWS],
        workers_hidden=max(0, len(workers) - MAX_ROWS),
        suspended=suspended,
        parked=parked,
        parked_hidden=parked_hidden,
        errors=errors,
        events=events,
        health=status is not None,
        index=index_ready,
        counts={
            "queues": len(found),
            "messages": sum(q.gauges.visible + q.gauges.in_flight + q.gauges.delayed for q in found),
            "held": held,
            "suspended": len(suspended),
            "parked": sum(q.parked for q in queues),
        },
        fences=hub is not None,
        missing=figures.missing,
        unreachable=unreachable,
        cluster=cluster if scope.operator else None,
        cluster_error=cluster_error if scope.operator else None,
    )


def _only(actions: list[Action], allowed: frozenset[str]) -> list[Action]:
    """The buttons whose admin route this gateway serves."""
    return [a for a in actions if a.kind in allowed]


# ---------------------------------------------------------------------------------------------- queues
def _shown(scope: Scope, core: str) -> str:
    return scope.queue_name(core) or core


def _face_query(scope: Scope, core: str) -> dict[str, str]:
    """`?face=dedupq` for an admin's EmoDB dedup queue (the retry routes' parameter); operators use core
    names."""
    face = queue_labels(core)[1]
    return {} if scope.operator or face == "queue" else {"face": face}


def _queue_row(
    scope: Scope,
    q: QueueFigures,
    suspended: dict[str, dict[str, Any]],
    history: BacklogHistory,
    allowed: frozenset[str],
) -> QueueRow:
    g = q.gauges
    tenant, face, _ = queue_labels(g.name)
    name = _shown(scope, g.name)
    series = history.series(g.name)
    ages = [s.oldest_age for s in series]
    unattempted = [s.unattempted_age for s in series]
    top = max([*ages, *unattempted, 0.0])
    width, height = CHART
    row = QueueRow(
        name=name,
        tenant=tenant,
        face=face,
        visible=g.visible,
        in_flight=g.in_flight,
        delayed=g.delayed,
        groups=g.groups,
        oldest_age=g.oldest_age,
        unattempted_age=g.oldest_unattempted_age,
        suspended=(name in suspended or q.suspended) if face == "queue" or scope.operator else False,
        parked=q.parked_count,
        chart=sparkline(ages, width, height, top),
        chart_unattempted=sparkline(unattempted, width, height, top),
        chart_max=top,
        samples=len(series),
    )
    # Failure management's suspend and resume name a queue of the queue face (operators: any core name).
    if face == "queue" or scope.operator:
        row.actions += _only([_resume(scope, name) if row.suspended else _suspend(scope, name)], allowed)
    return row


def _queue_path(name: str, tail: str, query: dict[str, str] | None = None) -> str:
    path = f"/admin/v1/queues/{quote(name, safe='')}/{tail}"
    return f"{path}?{urlencode(query)}" if query else path


def _suspend(scope: Scope, name: str) -> Action:
    return Action(
        "suspend",
        "Suspend",
        f"Suspend queue {name}? Nothing is delivered from it until it is resumed.",
        "POST",
        _queue_path(name, "suspend"),
        "reason",
        danger=True,
    )


def _resume(scope: Scope, name: str) -> Action:
    return Action("resume", "Resume", f"Resume queue {name}?", "POST", _queue_path(name, "resume"))


def _parked(
    scope: Scope, queues: list[QueueFigures], allowed: frozenset[str]
) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    hidden = 0
    for q in sorted(queues, key=lambda q: q.name):
        groups = q.parked
        name = _shown(scope, q.name)
        for group in groups[:MAX_PARKED_PER_QUEUE]:
            if len(rows) >= MAX_ROWS:
                hidden += 1
                continue
            release = Action(
                "release",
                "Release",
                f"Release parked group {group} of queue {name}? Its messages are "
                "delivered again, in order, with a fresh retry budget.",
                "POST",
                _queue_path(name, "groups/release", {"group": group, **_face_query(scope, q.name)}),
            )
            rows.append({"queue": name, "group": group, "actions": _only([release], allowed)})
        hidden += max(0, q.parked_count - min(len(groups), MAX_PARKED_PER_QUEUE))
    return rows, hidden


# --------------------------------------------------------------------------------------------- workers
def _workers(
    scope: Scope,
    hub: ControlHub | None,
    keys: KeyRing,
    status: dict[str, Any] | None,
    figures: Figures,
    allowed: frozenset[str],
) -> list[WorkerRow]:
    """Every worker credential the caller sees (healthy unless said otherwise), with failure management's
    view of it (its status here, else the state the queues' figures report) and its fence (where this
    gateway holds the fences), plus workers failure management knows that the key file does not (an
    operator's view)."""
    health = {w["worker"]: w for w in (status["workers"] if status is not None else [])}
    for held in figures.held:
        if held.worker not in health and scope.sees_worker(held.worker):
            health[held.worker] = {"worker": held.worker, "state": held.state}
    fences = {f.worker: f for f in (hub.fences() if hub is not None else []) if scope.sees_worker(f.worker)}
    names = {c.id for c in keys.credentials if fenceable(c) and scope.sees_worker(c.id)}
    names |= set(health) | set(fences)
    rows = []
    for name in sorted(names):
        h = health.get(name, {})
        fence = fences.get(name)
        state = h.get("state", "healthy")
        if fence is not None and state in ("healthy", "suspect"):
            state = "fenced"  # an operator's fence: it acts at the proxy
        fence_text = None
        if fence is not None:
            by = "failure management" if fence.reason.startswith(HEALTH_FENCE) else "an operator"
            reason = fence.reason.removeprefix(HEALTH_FENCE)
            fence_text = f"{fence.mode}, by {by}: {reason}"
        until = None
        if h.get("blacklisted_until"):
            until = f"blacklisted until {format_time(h['blacklisted_until'])}"
        elif fence is not None and fence.expires is not None:
            until = f"fence until {format_time(fence.expires)}"
        elif h.get("next_probe"):
            until = f"probe at {format_time(h['next_probe'])}"
        row = WorkerRow(
            worker=name,
            state=state,
            failures=int(h.get("failures", 0)),
            queue=h.get("queue"),
            reason=h.get("reason"),
            fence=fence_text,
            until=until,
        )
        path = f"/admin/v1/fences/{quote(name, safe='')}"
        known = keys.by_id(name)
        if fence is not None:
            row.actions.append(
                Action("unfence", "Unfence", f"Lift the fence of worker {name}?", "DELETE", path)
            )
        elif known is not None and fenceable(known):
            row.actions.append(
                Action(
                    "fence",
                    "Fence",
                    f"Fence worker {name}? The egress proxy blocks (or mimics) its calls.",
                    "PUT",
                    path,
                    "mode ttl reason",
                    danger=True,
                )
            )
        if state == "blacklisted":
            row.actions.append(
                Action(
                    "lift",
                    "Lift blacklist",
                    f"Lift the blacklist of worker {name}? It is probed again.",
                    "DELETE",
                    f"/admin/v1/blacklist/{quote(name, safe='')}",
                )
            )
        row.actions = _only(row.actions, allowed)
        rows.append(row)
    order = {"blacklisted": 0, "probing": 1, "fenced": 2, "suspect": 3, "healthy": 4}
    rows.sort(key=lambda r: (order.get(r.state, 5), r.worker))
    return rows


# ---------------------------------------------------------------------------------------------- errors
def _errors(
    scope: Scope, failures: ErrorCases | None, from_index: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    """The top error cases: the index's (`strictq errors`) when the caller may see them, else failure
    management's failed attempts still in its window, of the caller's queues."""
    if from_index is not None:
        cases = [
            {
                "signature": s.get("signature"),
                "count": s.get("count"),
                "detail": s.get("template") or "",
                "last_seen": format_time(s.get("last_seen")),
                "where": ", ".join(str(x) for x in (s.get("exemplars") or [])[:3]),
            }
            for s in from_index["signatures"]
        ]
        return {
            "source": "index",
            "note": f"from the index: {from_index.get('failures')} failure(s) in "
            f"{from_index.get('records')} record(s), as of {format_time(from_index.get('generated'))}",
            "cases": cases,
        }
    if failures is None:
        return {
            "source": "none",
            "note": "no error cases at hand: failure management is off (--no-health), out of reach, or keeps"
            " its tally on the queue server (the index's error cases are shown once `strictq index` ran)",
            "cases": [],
        }
    window = failures.window
    found = failures.cases
    cases = [
        {
            "signature": f["signature"] or "(no signature)",
            "count": f["count"],
            "detail": f["last_reason"],
            "last_seen": format_time(f["last_seen"]),
            "where": ", ".join(_shown(scope, q) for q in f["queues"]) + " · " + ", ".join(f["workers"]),
        }
        for f in found
    ]
    return {
        "source": "failures",
        "note": f"failed attempts in the last {window:g} s, from failure management"
        + ("" if scope.operator else "; the index's error cases are shown to operators"),
        "cases": cases,
    }
