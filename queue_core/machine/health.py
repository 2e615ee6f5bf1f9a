"""Worker health, fencing, probes and large-scale events (docs/failure-management.md §3), sans-I/O.

`HealthMonitor` turns what happened (counted attempts, probe results, alerts, operator commands, all
with an explicit `now`) into decisions the shell carries out and publishes as events: fence, unfence,
blacklist, unblacklist, probe, suspend, resume (plus the informational shared-failure, probe-passed,
probe-failed and alert). It never touches a queue itself: it only says who may receive what.

The rules, in the order they are applied:

- Precedence: a failure signature seen on at least `shared_failure_workers` distinct workers within
  `window` is a backend problem, not a worker's. Such failures never count toward fencing (a worker fenced
  earlier for them is unfenced), and the queues where it shows are checked with probes instead. Workers
  are counted per tenant (`access.tenancy.tenant_of` the queue): one tenant's failures never excuse another
  tenant's worker, nor show as shared on another tenant's queue.
- A worker with `worker_failures` other failed attempts within `window` is fenced: no more messages,
  probed every `probe_interval` (doubling up to `probe_backoff_max`). A passing probe restores it;
  `probe_failures_to_blacklist` failed probes in a row blacklist it for `blacklist_for` (no messages, no
  probes); on expiry (or when an operator lifts it) it is fenced and probed again.
- Large-scale event: when failed probes within `window` come from at least `large_scale_fraction` of a
  queue's recent workers (and from at least `shared_failure_workers` of them), or an alert names the
  queue or a signature failing on it, the queue is suspended: nobody receives from it, a probe goes to
  one of its workers every `probe_interval` (doubling), and the first one that passes resumes it. An
  operator's suspension is never lifted by a probe (no probes are sent for it).

Probes of a fenced worker exercise its handler path with the proxy mimicking its calls (or passing them
for a `probe_safe` queue), so only probes of workers that are not fenced can show that a backend is back.
"""

from __future__ import annotations

import fnmatch
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from access.tenancy import tenant_of

from .effects import AttemptRecorded

WorkerState = Literal["healthy", "suspect", "fenced", "probing", "blacklisted"]
WorkerInput = Literal[
    "failure",
    "recover",
    "fence",
    "probe_due",
    "probe_failed",
    "blacklist",
    "unblacklist",
    "restore",
    "adopt_blacklist",
]
WORKER_STATES: tuple[WorkerState, ...] = get_args(WorkerState)  # the Literals are the one list
WORKER_INPUTS: tuple[WorkerInput, ...] = get_args(WorkerInput)
# The worker lifecycle, the one place a worker's state changes (`next_state`); anything else raises.
# failure: an own failed attempt below the threshold; recover: no failure left in the window; fence: the
# threshold reached (or a fence adopted after a restart); probe_due: its probe goes out; probe_failed /
# blacklist: the probe failed (blacklist: the last one allowed); unblacklist: the blacklist ended (expiry
# or operator); restore: a probe passed, an operator lifted the fence, or its failures turned out shared;
# adopt_blacklist: a blacklist kept in the store, after a restart.
TRANSITIONS: dict[tuple[WorkerState, WorkerInput], WorkerState] = {
    ("healthy", "failure"): "suspect",
    ("suspect", "failure"): "suspect",
    ("suspect", "recover"): "healthy",
    ("healthy", "fence"): "fenced",
    ("suspect", "fence"): "fenced",
    ("fenced", "probe_due"): "probing",
    ("probing", "probe_failed"): "fenced",
    ("probing", "blacklist"): "blacklisted",
    ("blacklisted", "unblacklist"): "fenced",
    ("fenced", "restore"): "healthy",
    ("probing", "restore"): "healthy",
    ("blacklisted", "restore"): "healthy",
    ("healthy", "adopt_blacklist"): "blacklisted",
    ("suspect", "adopt_blacklist"): "blacklisted",
    ("fenced", "adopt_blacklist"): "blacklisted",
}


class IllegalTransition(RuntimeError):
    """A worker input its state does not allow: a bug in the monitor, never a user's mistake."""


def next_state(state: WorkerState, event: WorkerInput) -> WorkerState:
    """The state `event` leads to from `state` (TRANSITIONS); IllegalTransition if it is not allowed."""
    target = TRANSITIONS.get((state, event))
    if target is None:
        raise IllegalTransition(f"a {state} worker cannot take {event!r}")
    return target


ProbePurpose = Literal["worker", "check", "queue"]
FAILED_OUTCOMES = frozenset({"failed", "partial", "expired"})
EXPIRED_SIGNATURE = "claim expired"  # what a claim that ran out counts as when the worker said nothing
MAX_FAILURES_KEPT = 10_000  # per worker: a window holding more than this counts only the newest


SignatureKey = tuple[str | None, str]  # (tenant_of the queue, signature)


class HealthSettingsError(ValueError):
    """A setting out of range (the message names it)."""


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """Thresholds and intervals (seconds); defaults from docs/failure-management.md §3."""

    window: float = 60.0
    worker_failures: int = 5
    fence_mode: str = "block"
    shared_failure_workers: int = 2
    probe_interval: float = 5.0
    probe_backoff_max: float = 60.0
    probe_failures_to_blacklist: int = 3
    blacklist_for: float = 600.0
    large_scale_fraction: float = 0.5
    probe_timeout: float = 30.0  # a delivered probe with no result after this long has failed

    def validate(self) -> HealthSettings:
        for name in ("window", "probe_interval", "probe_backoff_max", "blacklist_for", "probe_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise HealthSettingsError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("worker_failures", "shared_failure_workers", "probe_failures_to_blacklist"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HealthSettingsError(f"{name} must be an integer >= 1, got {value!r}")
        if self.fence_mode not in ("block", "mimic"):
            raise HealthSettingsError(f"fence_mode must be block or mimic, got {self.fence_mode!r}")
        if not 0 < self.large_scale_fraction <= 1:
            raise HealthSettingsError(
                f"large_scale_fraction must be in (0, 1], got {self.large_scale_fraction}"
            )
        if self.probe_backoff_max < self.probe_interval:
            raise HealthSettingsError("probe_backoff_max must be at least probe_interval")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class Decision:
    """One decision or notable fact, in the shape of the contract's event (plus what the shell needs)."""

    event: str  # fence | unfence | blacklist | unblacklist | probe | suspend | resume | shared-failure
    #             | probe-passed | probe-failed | alert
    reason: str
    at: float
    worker: str | None = None
    queue: str | None = None
    probe_id: str | None = None
    mode: str | None = None  # fence: block | mimic
    expires: float | None = None  # blacklist: until when
    signature: str | None = None  # shared-failure, alert
    group: str | None = None  # events of the retry workflow (park, release, redrive) published beside these

    def to_event(self) -> dict[str, Any]:
        """The event as published: None fields left out."""
        data: dict[str, Any] = {"event": self.event, "reason": self.reason, "at": self.at}
        for name in ("worker", "queue", "group", "probe_id", "mode", "expires", "signature"):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data

    def summary(self) -> str:
        """The one log line of the event: `fence worker=w-1 queue=t.q: 5 failed attempts`."""
        worker = f" worker={self.worker}" if self.worker else ""
        queue = f" queue={self.queue}" if self.queue else ""
        return f"{self.event}{worker}{queue}: {self.reason}"


@dataclass(slots=True)
class Probe:
    """A dummy message: for one worker (`worker` set at creation) or for any worker of a suspended queue."""

    id: str
    queue: str
    purpose: ProbePurpose  # worker: a fenced worker's; check: a shared failure's; queue: a suspension's
    created: float
    worker: str | None  # None until delivered for `queue` probes
    delivered: float | None = None
    deadline: float | None = None  # delivered + probe_timeout


@dataclass(slots=True)
class PollVerdict:
    """What a poll of `queue` by `worker` gets: real messages only when `allowed`; `probe` first if any."""

    allowed: bool
    probe: Probe | None = None


ALLOWED = PollVerdict(True)
BLOCKED = PollVerdict(False)


@dataclass(slots=True)
class _Worker:
    name: str
    state: WorkerState = "healthy"
    # Failed attempts in the window: (at, queue, signature, reason).
    failures: deque[tuple[float, str, str, str]] = field(default_factory=deque)
    queue: str = ""  # where its latest failure (or poll, if none) was: where its probes go
    since: float = 0.0  # when it entered its current state
    reason: str = ""  # why it is fenced / blacklisted
    probe: Probe | None = None  # its outstanding probe (worker or check)
    probe_failures: int = 0  # in a row, while fenced
    next_probe: float | None = None
    until: float | None = None  # blacklist expiry
    last_seen: float = 0.0


@dataclass(slots=True)
class _Queue:
    name: str
    workers: dict[str, float] = field(default_factory=dict)  # worker -> last poll / attempt / probe
    signatures: dict[str, float] = field(default_factory=dict)  # failing signature -> last seen here
    failed_probes: dict[str, float] = field(default_factory=dict)  # worker -> its latest failed probe
    suspended: bool = False
    manual: bool = False  # suspended by an operator: only an operator resumes it
    since: float = 0.0
    reason: str = ""
    probe: Probe | None = None  # the suspension's outstanding probe
    next_probe: float | None = None
    delay: float = 0.0  # current suspension probe interval
    last_check: float = -math.inf  # last round of check probes
    last_seen: float = 0.0


class HealthMonitor:
    """Inputs: `attempt`, `poll`, `probe_result`, `alert`, operator commands, `handle_timer`.
    Outputs: `drain_decisions()`; `next_deadline()` says when to call `handle_timer`."""

    def __init__(self, settings: HealthSettings | None = None, *, probe_prefix: str = "") -> None:
        self.settings = (settings or HealthSettings()).validate()
        self.workers: dict[str, _Worker] = {}
        self.queues: dict[str, _Queue] = {}
        self.probes: dict[str, Probe] = {}
        self._probe_prefix = f"probe-{probe_prefix}"
        self._probe_ids = itertools.count(1)
        # (tenant, signature) -> {worker: last failure}: a signature is shared within one tenant only
        self._signatures: dict[SignatureKey, dict[str, float]] = {}
        self._shared: dict[SignatureKey, float] = {}  # (tenant, signature) currently judged shared -> since
        self._decisions: list[Decision] = []
        self._timers: list[tuple[float, int, str, str]] = []  # (at, tiebreak, kind, key), lazily deleted
        self._tiebreak = itertools.count()
        self._sweep_at: float | None = None

    # ------------------------------------------------------------------------------------------ output
    def drain_decisions(self) -> list[Decision]:
        decisions, self._decisions = self._decisions, []
        return decisions

    def _decide(self, event: str, reason: str, at: float, **fields: Any) -> Decision:
        decision = Decision(event, reason, at, **fields)
        self._decisions.append(decision)
        return decision

    # ------------------------------------------------------------------------------------------ lookups
    def blocked(self, worker: str) -> bool:
        """Whether `worker` may receive no real message at all (fenced, probing or blacklisted)."""
        state = self.workers.get(worker)
        return state is not None and state.state in ("fenced", "probing", "blacklisted")

    def suspended(self, queue: str) -> bool:
        state = self.queues.get(queue)
        return state is not None and state.suspended

    def worker_state(self, worker: str) -> WorkerState:
        state = self.workers.get(worker)
        return "healthy" if state is None else state.state

    def _worker(self, name: str) -> _Worker:
        state = self.workers.get(name)
        if state is None:
            state = self.workers[name] = _Worker(name)
        return state

    def _queue(self, name: str) -> _Queue:
        state = self.queues.get(name)
        if state is None:
            state = self.queues[name] = _Queue(name)
        return state

    # ----------------------------------------------------------------------------------------- attempts
    def attempt(self, record: AttemptRecorded) -> None:
        """One counted attempt (effect of the core): account it, then apply precedence and thresholds.
        Anonymous attempts (no worker id: the internal API's tools) are nobody's to fence."""
        if not record.worker:
            return
        now = record.at
        self._arm_sweep(now)
        worker = self._worker(record.worker)
        queue = self._queue(record.queue)
        worker.last_seen = queue.last_seen = now
        queue.workers[worker.name] = now
        if record.outcome not in FAILED_OUTCOMES:
            if worker.state == "suspect" and not self._recent_failures(worker, now):
                self._move(worker, "recover")
            return
        signature = record.signature or (EXPIRED_SIGNATURE if record.outcome == "expired" else "")
        failures = worker.failures
        failures.append((now, queue.name, signature, record.reason))
        if len(failures) > MAX_FAILURES_KEPT:
            failures.popleft()
        worker.queue = queue.name
        if signature:
            queue.signatures[signature] = now
            key = (tenant_of(queue.name), signature)
            self._signatures.setdefault(key, {})[worker.name] = now
            self._check_shared(key, queue, now)
        if worker.state in ("healthy", "suspect"):
            own = self._own_failures(worker, now)
            if own >= self.settings.worker_failures:
                last = record.reason or signature or record.outcome
                self._fence(worker, f"{own} failed attempts in {self.settings.window:g}s (last: {last})", now)
            else:
                self._move(worker, "failure")

    def _recent_failures(self, worker: _Worker, now: float) -> int:
        horizon = now - self.settings.window
        failures = worker.failures
        while failures and failures[0][0] < horizon:
            failures.popleft()
        return len(failures)

    def _own_failures(self, worker: _Worker, now: float) -> int:
        """Failures in the window that are the worker's own: not of a signature judged shared."""
        self._recent_failures(worker, now)
        shared: dict[tuple[str, str], bool] = {}
        own = 0
        for _, queue, signature, _ in worker.failures:
            judged = shared.get((queue, signature))
            if judged is None:
                judged = shared[queue, signature] = self._is_shared((tenant_of(queue), signature), now)
            own += not judged
        return own

    def _is_shared(self, key: SignatureKey, now: float) -> bool:
        if not key[1]:
            return False
        seen = self._signatures.get(key)
        if not seen:
            return False
        horizon = now - self.settings.window
        return sum(1 for at in seen.values() if at >= horizon) >= self.settings.shared_failure_workers

    def _check_shared(self, key: SignatureKey, queue: _Queue, now: float) -> None:
        """Precedence: a signature on enough workers of one tenant is the backend's; check the queue with
        probes."""
        horizon = now - self.settings.window
        signature = key[1]
        seen = self._signatures[key]
        for name in [w for w, at in seen.items() if at < horizon]:
            del seen[name]
        if len(seen) < self.settings.shared_failure_workers:
            self._shared.pop(key, None)
            return
        if key not in self._shared:
            self._shared[key] = now
            self._decide(
                "shared-failure",
                f"{signature!r} failed on {len(seen)} workers within {self.settings.window:g}s: a backend "
                "problem, nobody is fenced for it",
                now,
                queue=queue.name,
                signature=signature,
            )
            self._forgive(key, now)
        self._check_round(queue, f"shared failure {signature!r}", now)

    def _forgive(self, key: SignatureKey, now: float) -> None:
        """Workers fenced (not yet blacklisted) for failures of a signature now judged shared (in their
        tenant) are restored, unless enough of their own remain."""
        signature = key[1]
        failed = self._signatures[key]
        for worker in list(self.workers.values()):
            if worker.state not in ("fenced", "probing") or worker.name not in failed:
                continue
            if self._own_failures(worker, now) < self.settings.worker_failures:
                self._restore(worker, f"its failures were a shared backend problem ({signature!r})", now)

    def _check_round(self, queue: _Queue, why: str, now: float) -> None:
        """Probe every recent worker of the queue that can take one (at most once per probe_interval)."""
        if queue.suspended or now - queue.last_check < self.settings.probe_interval:
            return
        queue.last_check = now
        horizon = now - self.settings.window
        for name, seen in sorted(queue.workers.items()):
            if seen < horizon:
                continue
            worker = self._worker(name)
            if worker.state not in ("healthy", "suspect"):
                continue
            if worker.probe is None:
                worker.probe = self._new_probe(queue.name, "check", name, now, why)

    # ---------------------------------------------------------------------------------------- fencing
    def _move(self, worker: _Worker, event: WorkerInput) -> None:
        worker.state = next_state(worker.state, event)

    def _fence(self, worker: _Worker, reason: str, now: float) -> None:
        self._move(worker, "fence")
        worker.since = now
        worker.reason = reason
        worker.probe_failures = 0
        self._cancel_probe(worker.probe, now)
        worker.probe = None
        self._decide(
            "fence",
            reason,
            now,
            worker=worker.name,
            queue=worker.queue or None,
            mode=self.settings.fence_mode,
        )
        self._schedule_worker_probe(worker, now + self.settings.probe_interval)

    def _restore(self, worker: _Worker, reason: str, now: float) -> None:
        """Back to healthy with a clean slate: unfence (the shell lifts the proxy fence)."""
        was_blacklisted = worker.state == "blacklisted"
        self._cancel_probe(worker.probe, now)
        worker.probe = None
        self._move(worker, "restore")
        worker.since = now
        worker.reason = ""
        worker.failures.clear()
        worker.probe_failures = 0
        worker.next_probe = worker.until = None
        if was_blacklisted:
            self._decide("unblacklist", reason, now, worker=worker.name)
        self._decide("unfence", reason, now, worker=worker.name, queue=worker.queue or None)

    def _schedule_worker_probe(self, worker: _Worker, at: float) -> None:
        worker.next_probe = at
        self._schedule(at, "worker-probe", worker.name)

    def _backoff(self, failures: int) -> float:
        settings = self.settings
        return float(min(settings.probe_interval * 2 ** max(failures, 0), settings.probe_backoff_max))

    def _blacklist(self, worker: _Worker, reason: str, now: float) -> None:
        self._move(worker, "blacklist")
        worker.since = now
        worker.until = now + self.settings.blacklist_for
        worker.reason = reason
        worker.next_probe = None
        self._schedule(worker.until, "blacklist", worker.name)
        self._decide(
            "blacklist", reason, now, worker=worker.name, queue=worker.queue or None, expires=worker.until
        )

    def _unblacklist(self, worker: _Worker, reason: str, now: float) -> None:
        """Blacklist over: fenced again, probed from scratch (a passing probe restores it)."""
        self._move(worker, "unblacklist")
        worker.since = now
        worker.until = None
        worker.probe_failures = 0
        worker.reason = f"blacklist lifted ({reason}); probing again"
        self._decide("unblacklist", reason, now, worker=worker.name, queue=worker.queue or None)
        self._schedule_worker_probe(worker, now)

    # ------------------------------------------------------------------------------------------ probes
    def _new_probe(
        self, queue: str, purpose: ProbePurpose, worker: str | None, now: float, why: str
    ) -> Probe:
        probe = Probe(f"{self._probe_prefix}{next(self._probe_ids)}", queue, purpose, now, worker)
        self.probes[probe.id] = probe
        self._decide("probe", why, now, worker=worker, queue=queue, probe_id=probe.id)
        return probe

    def _cancel_probe(self, probe: Probe | None, now: float) -> None:
        """Forget an outstanding probe (its result, if one comes, is ignored); `probe_end` for the shell."""
        if probe is not None and self.probes.pop(probe.id, None) is not None:
            self._decide(
                "probe-cancelled",
                "no longer needed",
                now,
                worker=probe.worker,
                queue=probe.queue,
                probe_id=probe.id,
            )

    def poll(self, queue: str, worker: str, now: float, *, probes: bool = True) -> PollVerdict:
        """A worker polls a queue: whether it may get messages, and the probe to hand it first, if any
        (never with `probes` False: a poller that cannot take one, e.g. through the SQS face).

        Every poller counts among the queue's recent workers (the large-scale rule's denominator). A probe
        returned here counts as delivered: its result is due within `probe_timeout`."""
        q = self.queues.get(queue)
        if not worker:  # anonymous: never fenced nor probed, but a suspension holds for it too
            return BLOCKED if q is not None and q.suspended else ALLOWED
        if q is None:
            q = self._queue(queue)
            self._arm_sweep(now)
        q.workers[worker] = q.last_seen = now
        w = self.workers.get(worker)
        allowed = not q.suspended
        if w is not None:
            w.last_seen = now
            if not w.queue:
                w.queue = queue
            probe = w.probe
            if probes and probe is not None and probe.delivered is None and probe.queue in (queue, ""):
                probe.queue = queue  # "": a fence adopted after a restart, its queue learnt from this poll
                return PollVerdict(False, self._deliver(probe, worker, now))
            allowed = allowed and w.state in ("healthy", "suspect")
        if allowed:
            return ALLOWED
        if probes and q.suspended and (w is None or w.state in ("healthy", "suspect")):
            if q.probe is not None and q.probe.delivered is None:
                return PollVerdict(False, self._deliver(q.probe, worker, now))
        return BLOCKED

    def seen(self, queue: str, worker: str, now: float) -> None:
        """A poll of `queue` by `worker` that a gate elsewhere answered (a cluster's partition): the
        bookkeeping of `poll` (recent workers, where its probes go) without handing anything out."""
        if not worker:
            return
        q = self.queues.get(queue)
        if q is None:
            q = self._queue(queue)
            self._arm_sweep(now)
        q.workers[worker] = q.last_seen = now
        w = self.workers.get(worker)
        if w is not None:
            w.last_seen = now
            if not w.queue:
                w.queue = queue

    def delivered(self, probe_id: str, worker: str, now: float) -> bool:
        """A gate elsewhere handed probe `probe_id` to `worker` (a cluster's partition): its result is due
        within `probe_timeout`. False when the probe is no longer out or went to someone else already."""
        probe = self.probes.get(probe_id)
        if probe is None or probe.delivered is not None:
            return False
        if probe.worker is not None and probe.worker != worker:
            return False
        self.seen(probe.queue, worker, now)
        self._deliver(probe, worker, now)
        return True

    def _deliver(self, probe: Probe, worker: str, now: float) -> Probe:
        probe.worker = worker
        probe.delivered = now
        probe.deadline = now + self.settings.probe_timeout
        self._schedule(probe.deadline, "probe-timeout", probe.id)
        return probe

    def probe_result(self, worker: str, probe_id: str, ok: bool, reason: str, now: float) -> bool:
        """The result of a delivered probe; False when no such probe is outstanding for this worker."""
        probe = self.probes.get(probe_id)
        if probe is None or probe.delivered is None or probe.worker != worker:
            return False
        del self.probes[probe_id]
        w = self._worker(worker)
        q = self._queue(probe.queue)
        if w.probe is probe:
            w.probe = None
        if q.probe is probe:
            q.probe = None
        q.workers[worker] = now
        if ok:
            self._probe_passed(probe, w, q, reason, now)
        else:
            self._probe_failed(probe, w, q, reason or "failed", now)
        return True

    def _probe_passed(self, probe: Probe, w: _Worker, q: _Queue, reason: str, now: float) -> None:
        q.failed_probes.pop(w.name, None)
        self._decide("probe-passed", reason or "ok", now, worker=w.name, queue=q.name, probe_id=probe.id)
        if probe.purpose == "worker" and w.state in ("fenced", "probing"):
            self._restore(w, f"probe {probe.id} passed", now)
        if probe.purpose != "worker" and q.suspended and not q.manual:
            self._resume(q, f"probe {probe.id} passed on {w.name}", now)

    def _probe_failed(self, probe: Probe, w: _Worker, q: _Queue, reason: str, now: float) -> None:
        q.failed_probes[w.name] = now
        self._decide("probe-failed", reason, now, worker=w.name, queue=q.name, probe_id=probe.id)
        settings = self.settings
        if probe.purpose == "worker" and w.state == "probing":
            w.probe_failures += 1
            if w.probe_failures >= settings.probe_failures_to_blacklist:
                self._blacklist(w, f"{w.probe_failures} probes failed in a row (last: {reason})", now)
            else:
                self._move(w, "probe_failed")
                self._schedule_worker_probe(w, now + self._backoff(w.probe_failures))
        if q.suspended:
            if probe.purpose == "queue" and not q.manual:
                q.delay = min(q.delay * 2, settings.probe_backoff_max)
                self._schedule_queue_probe(q, now + q.delay)
            return
        horizon = now - settings.window
        failing = sum(1 for at in q.failed_probes.values() if at >= horizon)
        recent = sum(1 for at in q.workers.values() if at >= horizon)
        if failing >= max(settings.shared_failure_workers, settings.large_scale_fraction * recent):
            self._suspend(
                q,
                f"large-scale event: probes failed on {failing} of {recent} recent workers",
                now,
                manual=False,
            )

    def _schedule_queue_probe(self, q: _Queue, at: float) -> None:
        q.next_probe = at
        self._schedule(at, "queue-probe", q.name)

    # -------------------------------------------------------------------------------------- suspension
    def _suspend(self, q: _Queue, reason: str, now: float, *, manual: bool) -> None:
        if q.suspended:
            if manual and not q.manual:  # an operator takes over an automatic suspension
                q.manual = True
                q.reason = reason
                self._cancel_probe(q.probe, now)
                q.probe = None
                q.next_probe = None
            return
        q.suspended = True
        q.manual = manual
        q.since = now
        q.reason = reason
        self._decide("suspend", reason, now, queue=q.name)
        if not manual:
            q.delay = self.settings.probe_interval
            self._schedule_queue_probe(q, now + q.delay)

    def _resume(self, q: _Queue, reason: str, now: float) -> None:
        if not q.suspended:
            return
        q.suspended = q.manual = False
        q.since = now
        q.reason = ""
        q.next_probe = None
        q.failed_probes.clear()
        self._cancel_probe(q.probe, now)
        q.probe = None
        q.last_check = now  # a shared signature still in the window must not re-check at once
        self._decide("resume", reason, now, queue=q.name)

    # -------------------------------------------------------------------------------- alerts, operators
    def alert(
        self,
        reason: str,
        now: float,
        *,
        queue: str | None = None,
        signatures: Iterable[str] = (),
        within: Callable[[str], bool] | None = None,
    ) -> list[str]:
        """A known-error-case alert (`strictq errors`' rules): suspend the queue it names, or the queues
        where a matching signature (exact or glob) failed within the window, among those `within` accepts
        (a tenant's alert reaches only its tenant's queues). Returns the queues suspended."""
        self._arm_sweep(now)
        patterns = [s for s in signatures if s]
        horizon = now - self.settings.window
        if queue is not None:
            targets = [queue]
        else:
            targets = sorted(
                q.name
                for q in self.queues.values()
                if (within is None or within(q.name))
                and any(
                    at >= horizon and any(sig == p or fnmatch.fnmatchcase(sig, p) for p in patterns)
                    for sig, at in q.signatures.items()
                )
            )
        self._decide("alert", reason, now, queue=queue, signature=", ".join(patterns) or None)
        suspended = []
        for name in targets:
            q = self._queue(name)
            if not q.suspended:
                self._suspend(q, f"alert: {reason}", now, manual=False)
                suspended.append(name)
        return suspended

    def suspend(self, queue: str, reason: str, now: float, *, manual: bool = True) -> None:
        """Operator: stop deliveries from `queue` until `resume` (no probes, no automatic resume).
        `manual=False` restores an automatic suspension after a restart (probed, resumes by itself)."""
        self._suspend(self._queue(queue), reason, now, manual=manual)

    def resume(self, queue: str, reason: str, now: float) -> bool:
        """Operator: resume a suspended queue (automatic or not); False if it was not suspended."""
        q = self.queues.get(queue)
        if q is None or not q.suspended:
            return False
        self._resume(q, reason, now)
        return True

    def unfence(self, worker: str, reason: str, now: float) -> bool:
        """Operator (e.g. `strictq unfence`): restore a fenced, probing or blacklisted worker."""
        w = self.workers.get(worker)
        if w is None or w.state not in ("fenced", "probing", "blacklisted"):
            return False
        self._restore(w, reason, now)
        return True

    def lift_blacklist(self, worker: str, reason: str, now: float) -> bool:
        """Operator: end a blacklist early; the worker is fenced and probed again."""
        w = self.workers.get(worker)
        if w is None or w.state != "blacklisted":
            return False
        self._unblacklist(w, reason, now)
        return True

    def adopt_fence(self, worker: str, reason: str, since: float, now: float) -> None:
        """After a restart: a fence this monitor had set is still in force; keep the worker fenced and
        probe it again (its blacklist, failures and probes were not kept)."""
        w = self._worker(worker)
        if w.state in ("fenced", "probing", "blacklisted"):
            return
        self._move(w, "fence")
        w.since = since
        w.reason = reason
        w.last_seen = now
        self._schedule_worker_probe(w, now + self.settings.probe_interval)

    def adopt_blacklist(
        self, worker: str, reason: str, since: float, until: float, queue: str, now: float
    ) -> None:
        """After a restart: a blacklist kept in the store is still in force until `until` (it ends as
        usual: the worker is fenced and probed again); one already over leaves the worker fenced."""
        w = self._worker(worker)
        if w.state in ("probing", "blacklisted"):
            return
        w.queue = w.queue or queue
        w.last_seen = now
        self._move(w, "adopt_blacklist")
        w.since = since
        w.reason = reason
        w.next_probe = None
        w.until = max(until, now)
        self._schedule(w.until, "blacklist", w.name)

    # ------------------------------------------------------------------------------------------- time
    def _schedule(self, at: float, kind: str, key: str) -> None:
        heapq.heappush(self._timers, (at, next(self._tiebreak), kind, key))

    def _live(self, at: float, kind: str, key: str) -> bool:
        """Whether a timer entry still stands (entries are never removed when plans change)."""
        if kind == "worker-probe":
            w = self.workers.get(key)
            return w is not None and w.next_probe == at and w.state == "fenced"
        if kind == "blacklist":
            w = self.workers.get(key)
            return w is not None and w.until == at and w.state == "blacklisted"
        if kind == "probe-timeout":
            probe = self.probes.get(key)
            return probe is not None and probe.deadline == at
        if kind == "queue-probe":
            q = self.queues.get(key)
            return q is not None and q.next_probe == at and q.suspended
        return kind == "sweep" and self._sweep_at == at

    def next_deadline(self) -> float | None:
        timers = self._timers
        while timers and not self._live(timers[0][0], timers[0][2], timers[0][3]):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def handle_timer(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, _, kind, key = heapq.heappop(timers)
            if self._live(at, kind, key):
                self._fire(kind, key, now)

    def _fire(self, kind: str, key: str, now: float) -> None:
        if kind == "worker-probe":
            w = self.workers[key]
            w.next_probe = None
            self._move(w, "probe_due")
            attempt = w.probe_failures + 1
            w.probe = self._new_probe(
                w.queue,
                "worker",
                w.name,
                now,
                f"fenced worker, probe {attempt} of {self.settings.probe_failures_to_blacklist}",
            )
        elif kind == "blacklist":
            self._unblacklist(self.workers[key], "expired", now)
        elif kind == "probe-timeout":
            probe = self.probes[key]
            assert probe.worker is not None
            self.probe_result(
                probe.worker, probe.id, False, f"no result within {self.settings.probe_timeout:g}s", now
            )
        elif kind == "queue-probe":
            q = self.queues[key]
            q.next_probe = None
            if q.probe is None:
                q.probe = self._new_probe(q.name, "queue", None, now, f"suspended: {q.reason}")
        else:
            self._sweep(now)

    def _arm_sweep(self, now: float) -> None:
        if self._sweep_at is None:
            self._sweep_at = now + self.settings.window
            self._schedule(self._sweep_at, "sweep", "")

    def _sweep(self, now: float) -> None:
        """Forget what left the window: idle healthy workers, quiet queues, old signatures (bounded state)."""
        self._sweep_at = None
        horizon = now - self.settings.window
        for name, w in list(self.workers.items()):
            if w.state in ("healthy", "suspect") and w.probe is None and w.last_seen < horizon:
                del self.workers[name]
            elif w.state == "suspect" and not self._recent_failures(w, now):
                self._move(w, "recover")
        for q in list(self.queues.values()):
            for table in (q.workers, q.signatures, q.failed_probes):
                for key in [k for k, at in table.items() if at < horizon]:
                    del table[key]
            if not q.suspended and q.probe is None and q.last_seen < horizon and not q.workers:
                del self.queues[q.name]
        for signature_key, seen in list(self._signatures.items()):
            for name in [w for w, at in seen.items() if at < horizon]:
                del seen[name]
            if len(seen) < self.settings.shared_failure_workers:
                self._shared.pop(signature_key, None)
            if not seen:
                del self._signatures[signature_key]
        if self.workers or self.queues:
            self._arm_sweep(now)

    # ----------------------------------------------------------------------------------------- status
    def status(self, now: float) -> dict[str, Any]:
        """Workers and queues as operators see them (`GET /admin/v1/status`)."""
        workers = []
        for name in sorted(self.workers):
            w = self.workers[name]
            own = self._own_failures(w, now)
            entry: dict[str, Any] = {
                "worker": name,
                "state": w.state,
                "failures": own,
                "failures_shared": len(w.failures) - own,
                "queue": w.queue or None,
                "since": w.since or None,
                "reason": w.reason or None,
                "probe_failures": w.probe_failures,
                "next_probe": w.next_probe,
                "blacklisted_until": w.until,
                "probe": None if w.probe is None else w.probe.id,
            }
            workers.append(entry)
        queues = []
        horizon = now - self.settings.window
        for name in sorted(self.queues):
            q = self.queues[name]
            namespace = tenant_of(name)
            queues.append(
                {
                    "queue": name,
                    "suspended": q.suspended,
                    "manual": q.manual,
                    "since": q.since or None,
                    "reason": q.reason or None,
                    "next_probe": q.next_probe,
                    "recent_workers": sum(1 for at in q.workers.values() if at >= horizon),
                    "failed_probes": sum(1 for at in q.failed_probes.values() if at >= horizon),
                    "shared_signatures": sorted(
                        s
                        for s, at in q.signatures.items()
                        if at >= horizon and self._is_shared((namespace, s), now)
                    ),
                }
            )
        return {"workers": workers, "queues": queues, "probes": len(self.probes)}

    def failure_signatures(
        self, now: float, within: Callable[[str], bool] | None = None, top: int = 10
    ) -> list[dict[str, Any]]:
        """The failed attempts still in the window, by signature (the operator's dashboard's top error
        cases when no index is at hand): count, workers, queues, the latest reason and time, most frequent
        first. `within`: only failures on queues it accepts (a tenant's); None: every queue."""
        horizon = now - self.settings.window
        found: dict[str, dict[str, Any]] = {}
        for worker in self.workers.values():
            for at, queue, signature, reason in worker.failures:
                if at < horizon or (within is not None and not within(queue)):
                    continue
                entry = found.get(signature)
                if entry is None:
                    entry = found[signature] = {
                        "signature": signature,
                        "count": 0,
                        "workers": set(),
                        "queues": set(),
                        "last_seen": at,
                        "last_reason": reason,
                    }
                entry["count"] += 1
                entry["workers"].add(worker.name)
                entry["queues"].add(queue)
                if at >= entry["last_seen"]:
                    entry["last_seen"], entry["last_reason"] = at, reason
        ranked = sorted(found.values(), key=lambda e: (-e["count"], -e["last_seen"], e["signature"]))
        return [{**e, "workers": sorted(e["workers"]), "queues": sorted(e["queues"])} for e in ranked[:top]]
