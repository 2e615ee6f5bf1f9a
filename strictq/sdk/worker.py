"""The asyncio worker: poll, run a coroutine per message, heartbeat, ack or release, stop gracefully.

    async def handle(msg: strictq.sdk.Message) -> None:
        async with msg.http.post("https://billing.example/charge", json=msg.payload) as resp:
            resp.raise_for_status()

    worker = Worker("orders", handle)          # configured from STRICTQ_* (see `config`)
    raise SystemExit(strictq.sdk.run(worker))  # until SIGTERM (exit 0) or Ctrl-C (exit 130)

    # or, inside your own event loop:
    worker.install_signal_handlers()           # SIGTERM/SIGINT: stop gracefully
    await worker.run()                         # until stop()

What it does, against the gateway's EmoDB face:
- Polls with a claim ttl, declaring `X-Strictq-Capabilities: results, probes, request_ids` on every poll
  (it reports attempt results and handles probes: failure management applies to it; without the results
  route, or with `report_results=False`, it declares only `request_ids` and gets plain EmoDB semantics).
  `request_ids`: each item names the request that sent its message (`msg.request_id`), which the worker
  passes on in its outbound calls' tags and its results, so the wire log ties them to the producer's
  request. An empty poll is
  followed by a bounded backoff (0.05 s doubling to 0.5 s). A poll that fails for a transient reason
  (gateway down, 5xx, 429: strictq.sdk.retry decides) backs off with full jitter (`backoff`, default 0.1 s
  doubling to 30 s, reset by a poll that works), logged once per step of the backoff, not per retry. A
  permanent failure stops the worker with one clear error (`WorkerError`): the gateway refuses its key
  (401/403: STRICTQ_WORKER_ID / STRICTQ_WORKER_SECRET), its certificate cannot be verified
  (STRICTQ_CA_FILE), the queue name is refused, or the answer is not a list of poll items. Missing or
  invalid settings (`ConfigError`) are raised by `run()`, not by the constructor, so `strictq.sdk.run`
  reports them as one line too.
  With `wait=` set, each poll long-polls up to that many seconds on the face (a stop then waits for the
  poll in flight, so keep it short).
- A poll claims whole groups (strict FIFO). The messages of one group are processed one at a time in seq
  order; different groups concurrently, at most `concurrency` groups at once (the poll's limit never
  exceeds the free slots). A group is never run twice at once in this process: if a poll returns a group
  whose older claim is still being worked on here, that older claim is stale (the new token superseded
  it): its handler is cancelled and the new run starts only after the old one ended.
- Heartbeats: once work on a claim has lasted `heartbeat_fraction` of the ttl, the claim is renewed
  (extend) for another ttl, and so on while it runs (the backlog article's heartbeating). A refused renew
  (409: superseded) cancels the handler; so does failing to renew until the claim is about to expire.
- Log data (docs/failure-management.md §1): each attempt's outcome is reported to the gateway's results
  route with the steps the handler completed (`await msg.step(name, result)`), its partial results
  (`msg.partial = ...`), free-form fields (`msg.fields[...]`), a reason, a signature (what failed: the
  failed outbound call, or the error's kind; strictq.sdk.attempt) and the duration. The handler returns:
  `succeeded` (the message is deleted, like a fenced ack). It raises: `partial` if it completed a step or
  set partial results, else `failed` (raise `AttemptFailed(reason)` to give the reason yourself); the
  core's retry workflow decides when and where it runs again (retry_backoff, same worker first), and the
  retried delivery's `msg.history` carries what earlier attempts did (`attempts`, `last_reason`, `steps`,
  `partial`; `msg.history.done("charged-card")`) so the handler can skip or verify finished steps.
- Batches (SQS FIFO semantics): a claim's messages of one group run in seq order; at the first failure the
  group stops: the messages before it succeeded (reported one by one as they finished), it failed, and
  the rest are reported `not_attempted` in the same request (they go back untouched, in order).
- Probes (failure management's dummy messages, `msg.probe` true): routed to the `probe` handler when one
  is given (`Worker(queue, handle, probe=check)`), else to the normal handler, and reported like any
  message (succeeded passes the probe). They are not heartbeated (they are not claims).
- Against a gateway without the results route (an older version) the worker falls back to acks and
  releases: success is acked; a failure holds the group's claim for a backoff (`retry_backoff`, doubling
  with the attempt: a poison message must not spin) and then releases it (renew ttl 0); the reason is only
  logged (logger `strictq.sdk`) and counted.
- `msg.http` is an aiohttp session whose calls carry the message's tags (`X-Strictq-*`, call ordinal per
  attempt), go through `STRICTQ_PROXY_URL` with Proxy-Authorization basic worker id:secret, and cancel
  the handler when the proxy answers `X-Strictq-Proxy-Action: stale-lease` or `block` (the call raises
  `CallFenced`). Such a message is not acked; after `block` the group is handed back at once
  (`not_attempted`: other workers get it), after `stale-lease` nothing is done (the claim is someone
  else's now). Either refusal, and a 407 from the proxy, makes the worker back off: no poll until a wait
  drawn with full jitter from `backoff` (doubling per refusal in a row, up to its cap), one log line per
  step of the backoff; a call that passes the proxy again ends it.
- Fleet (strictq.sdk.fleet, docs/fleet.md; `fleet=False`: none): heartbeats with load and capabilities
  every `fleet_interval`, and the queue service's control messages (config, log_level, sleep / wake, drain,
  upgrade through the `upgrade=` hook) applied at run time; asleep or drained, it polls nothing (what a
  poll in flight brings back is handed back at once) and finishes what it holds.
- `stop()` (or SIGTERM / SIGINT after `install_signal_handlers()`, or `strictq.sdk.run`): no more polls;
  a poll in flight is awaited and what it claimed is released; running handlers get `grace` seconds to
  finish (and are reported), then are cancelled; everything claimed and not processed is handed back
  (`not_attempted`: no attempt counted, nothing counted against the worker), so other workers get it at
  once instead of after the ttl. A second signal stops at once (still handing back). Cancelling `run()`
  hands back what it held too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from protocol.estimates import Estimate
from wirelog.record import ACTION_STALE_LEASE

from .attempt import (
    EMPTY_HISTORY,
    AttemptFailed,
    History,
    add_step,
    failure_reason,
    failure_signature,
    result_item,
)
from .backoff import Backoff
from .client import EmoClient
from .config import ClientConfig
from .errors import (
    ConfigError,
    GatewayError,
    LeaseRefused,
    MalformedPollItem,
    ResultsUnsupported,
    SetupError,
)
from .fleet import (
    CAPABILITY_CONTROL,
    MAX_MESSAGE_BYTES,
    FleetAgent,
    UpgradeHook,
    machine_cpus,
    machine_memory_mib,
)
from .item import PollItem
from .local_state import LocalState, StateDisabled, StateTooLarge
from .outbound import CURRENT, Tags, proxy_authorization, tagged_session
from .pipeline import NotStarted, Pipeline, Preprocess, inline
from .retry import Retry, transient

log = logging.getLogger("strictq.sdk")

MIN_BACKOFF = 0.05
MAX_BACKOFF = 0.5
MAX_ERROR_BACKOFF = 1.0  # retries of one ack / report / renew within the claim's ttl
CAPABILITY_RESULTS = "results"  # X-Strictq-Capabilities: the worker reports attempt results
CAPABILITY_PROBES = "probes"  # ... and handles probes (failure management's dummy messages)
CAPABILITY_REQUEST_IDS = "request_ids"  # ... and wants each message's sending request id (no semantics)
CAPABILITY_STATE = "state"  # ... and keeps local state per group, moved with the group (local_state)
CAPABILITY_ESTIMATES = "estimates"  # ... and each message's processing-time estimate (pipelining)
EXIT_SIGINT = 130  # 128 + SIGINT, the shell's convention for Ctrl-C
EXIT_FAILED = 1  # a worker could not go on (WorkerError)
EXIT_CONFIG = 2  # settings missing or invalid (ConfigError), as the CLI's usage errors
WORKER_KEY_SETTING = "STRICTQ_WORKER_ID/STRICTQ_WORKER_SECRET"


@dataclass(slots=True)
class Message:
    """What a handler gets: the message, its claim, a tagged outbound session, what earlier attempts did
    (`history`), and what this attempt records for its log data (`step()`, `partial`, `fields`)."""

    queue: str
    id: str
    group: str
    seq: int
    token: int | str  # the claim's fencing token (X-Strictq-Lease)
    attempt: int  # the receive count when the gateway reports it, else 1
    payload: Any
    http: aiohttp.ClientSession = field(repr=False)
    worker_id: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the poll item's JSON (PollItem.raw)
    probe: bool = False  # a dummy message of failure management: exercise the handler path, no real work
    history: History = EMPTY_HISTORY  # prior failed attempts' log data (empty on a first delivery)
    request_id: str | None = None  # the id of the request that sent the message (the producer's)
    steps: list[dict[str, Any]] = field(default_factory=list)  # completed in this attempt (use step())
    partial: Any = None  # this attempt's partial results (JSON): reported when it fails
    fields: dict[str, Any] = field(default_factory=dict)  # free-form structured fields for the log data
    # The group's local state on this worker (Worker(state_limit=...); strictq.sdk.local_state).
    state: dict[str, Any] = field(default_factory=StateDisabled)
    # Pipelining (strictq.sdk.pipeline; with `Worker(preprocess=...)`): what the pre-processing returned,
    # the estimate it was scheduled by, and how long each stage of this attempt took.
    prepared: Any = None
    estimate: Estimate | None = None
    preprocess_ms: float | None = None
    processing_ms: float | None = None

    async def step(self, name: str, result: Any = None) -> None:
        """Record that this attempt completed the step `name` (with its JSON `result`): reported with the
        outcome, and carried to the next attempt's `history` should this one fail."""
        add_step(self.steps, name, result)


Context = Message
Handler = Callable[[Message], Awaitable[Any]]


@dataclass(slots=True)
class WorkerStats:
    polls: int = 0
    received: int = 0
    acked: int = 0  # succeeded: deleted (reported succeeded, or acked)
    failed: int = 0  # the handler raised or was cancelled
    released: int = 0  # messages handed back (reported failed / partial / not_attempted, or renew ttl 0)
    lost: int = 0  # claims lost (superseded, expired, or refused at ack)
    heartbeats: int = 0
    reported: int = 0  # attempt results the gateway took (status ok)
    probes: int = 0  # probes handled
    probes_failed: int = 0
    reasons: list[str] = field(default_factory=list)  # the latest release reasons (bounded)

    def note(self, reason: str) -> None:
        self.reasons.append(reason)
        del self.reasons[:-100]


class WorkerError(Exception):
    """The worker cannot go on (e.g. the gateway refuses its credential or the queue name); the message is
    the one line to show, naming the setting to fix when it is one."""


class Worker:
    def __init__(
        self,
        queue: str,
        handler: Handler,
        *,
        config: ClientConfig | None = None,
        ttl: float = 30.0,
        limit: int = 10,
        concurrency: int = 8,
        heartbeat_fraction: float = 1 / 3,
        grace: float = 10.0,
        wait: float | None = None,
        gateway_timeout: float = 30.0,
        retry_backoff: tuple[float, float] = (0.1, 30.0),
        probe: Handler | None = None,
        report_results: bool | None = None,
        backoff: tuple[float, float] = (0.1, 30.0),
        version: str = "",
        max_message_bytes: int = 0,
        state_limit: int = 0,
        preprocess: Preprocess | None = None,
        pipeline: bool = True,
        prefetch: int = 1,
        fleet: bool = True,
        fleet_interval: float = 5.0,
        cpus: int | None = None,
        memory_mib: int | None = None,
        upgrade: UpgradeHook | None = None,
    ) -> None:
        """`state_limit`: keep local state per group (`msg.state`), at most this many bytes of JSON each,
        moved with the group when the queue service hands it to another worker (strictq.sdk.local_state,
        docs/state-transfer.md); 0 (default): no local state, no `state` capability.
        `preprocess`: an async function of a message whose result the handler gets as `msg.prepared`;
        it may run in any order (fetching inputs, parsing). With it the worker pipelines (`pipeline=True`,
        strictq.sdk.pipeline): it claims up to `prefetch` messages of other groups ahead and pre-processes
        each while others are processed, scheduled by their estimates; `pipeline=False` pre-processes
        just before the handler, in its slot.
        `version`: the software version this worker runs, named on its polls (`X-Strictq-Worker-Version`)
        so group routing can give a rollout's canary share only to the canary version's workers.
        `max_message_bytes`: the largest message body this worker should get (0: any); a group whose next
        message is bigger goes to a worker that takes it, when one is polling (`X-Strictq-Worker-Max-Bytes`).
        `probe`: the handler for probes (failure management's dummy messages; default: `handler`).
        `report_results`: report attempt results (log data) to the gateway; None (default) does when the
        gateway has the route and falls back to acks and releases when it has not; False never does (and
        the worker then declares no capability: plain EmoDB semantics, no failure management).
        `backoff`: (base, cap) seconds of the full-jitter backoff after a failing poll or a call the egress
        proxy refused.
        `fleet`: send heartbeats every `fleet_interval` seconds and follow the queue service's control
        messages (strictq.sdk.fleet, docs/fleet.md), declaring `cpus`, `memory_mib` (default: this
        machine's) and `max_message_bytes`; `upgrade`: the hook an `upgrade` control runs,
        `async fn(version, args) -> the version now running` (without it, upgrades are refused)."""
        if not 0 < heartbeat_fraction < 0.9:
            raise ValueError("heartbeat_fraction must be in (0, 0.9)")
        if ttl <= 0 or limit < 1 or concurrency < 1:
            raise ValueError("ttl must be positive, limit and concurrency at least 1")
        if not 0 < backoff[0] <= backoff[1]:
            raise ValueError("backoff must be (base, cap) with 0 < base <= cap")
        # Settings from the environment are checked here but a problem is raised by run(), so that
        # `raise SystemExit(run(Worker(...)))` reports it as one line (strictq.sdk.run), not a traceback.
        self._config: ClientConfig | None = None
        self._setup_error: ConfigError | None = None
        self._api_key = ""
        try:
            self._config = config or ClientConfig.from_env()
            self._api_key = self._config.worker_key()
        except ConfigError as exc:
            self._setup_error = exc
        self.worker_id = (self._config.worker_id if self._config is not None else None) or ""
        self.queue = queue
        self.handler = handler
        self.probe_handler = probe
        self.report_results = report_results  # None: not known yet (the first report tells)
        self.ttl = float(ttl)
        self.limit = limit
        self.concurrency = concurrency
        self.heartbeat_fraction = heartbeat_fraction
        self.grace = grace
        self.wait = wait
        self.gateway_timeout = gateway_timeout
        # Without the results route: the group's claim is held (heartbeats go on) for base * 2**(attempt-1)
        # seconds, at most `max`, before it is released, so a poison message does not spin. With results,
        # the core's retry policy delays retries; a proxy refusal pauses polling instead (`backoff`).
        self.retry_backoff = retry_backoff
        self.backoff = backoff
        self.version = version
        if max_message_bytes < 0:
            raise ValueError("max_message_bytes must be 0 (any) or more")
        self.max_message_bytes = max_message_bytes
        self.local_state = LocalState(state_limit) if state_limit else None
        self._exporting: set[str] = set()  # groups whose state is being uploaded
        self.preprocess = preprocess
        self._polls = Retry(f"poll of {queue}", *backoff, log_steps=True)  # gateway down, 5xx, 429
        self._refusals = Backoff(*backoff)  # calls the egress proxy refused (block, stale-lease, 407)
        self._refusal_epoch = 0  # +1 per counted refusal: claims polled before it belong to that episode
        self._paused_until = 0.0  # loop time before which no poll is made (the refusal backoff)
        self.stop_signal: int | None = None  # the signal that stopped the worker (install_signal_handlers)
        self.stats = WorkerStats()
        self._proxy_headers: dict[str, str] = {}
        self._proxy_url: str | None = None
        if self._config is not None:
            self._proxy_headers = proxy_authorization(self._config.worker_id, self._config.worker_secret)
            self._proxy_url = self._config.proxy_for(self.worker_id)  # one of several proxy processes
        self._stopping = asyncio.Event()
        self._pipeline: Pipeline | None = None
        if preprocess is not None and pipeline:
            self._pipeline = Pipeline(preprocess, concurrency, prefetch, self._stopping)
        self._changed = asyncio.Event()  # a run finished or stop was asked: the poller may go on
        self._stop_now = asyncio.Event()  # the grace is over (or a second stop/signal)
        self._runs: dict[str, _GroupRun] = {}  # the latest run per group
        self._active: set[_GroupRun] = set()
        self._started = False
        self._gateway: EmoClient | None = None
        self._connector: aiohttp.BaseConnector | None = None
        self._http: aiohttp.ClientSession | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._poll_task: asyncio.Task[None] | None = None
        if fleet_interval <= 0:
            raise ValueError("fleet_interval must be positive")
        self.fleet: FleetAgent | None = None
        if fleet:
            capacity = {
                "cpus": cpus if cpus is not None else machine_cpus(),
                "memory_mib": memory_mib if memory_mib is not None else machine_memory_mib(),
                "max_message_bytes": max_message_bytes or MAX_MESSAGE_BYTES,
            }
            self.fleet = FleetAgent(self, fleet_interval, capacity, upgrade)

    # ------------------------------------------------------------------------------------- public API

    @property
    def config(self) -> ClientConfig:
        """The worker's settings; the `ConfigError` they had when they could not be read."""
        if self._config is None:
            assert self._setup_error is not None
            raise self._setup_error
        return self._config

    @property
    def http(self) -> aiohttp.ClientSession:
        """A session for outbound calls that tags them with the message whose handler makes the call
        (found from the context; untagged outside handlers). Handlers can use `msg.http` just as well."""
        if self._http is None:
            raise RuntimeError("the worker is not running")
        return self._http

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the worker declares on every poll (`X-Strictq-Capabilities`): it reports attempt results
        and handles probes (with `probe=` or, without one, with the handler), and it takes each message's
        sending request id. Only the last once it is known not to report (`report_results=False`, or a
        gateway without the results route): request ids change no semantics."""
        state = (CAPABILITY_STATE,) if self.local_state is not None else ()
        estimates = (CAPABILITY_ESTIMATES,) if self.preprocess is not None else ()
        control = (CAPABILITY_CONTROL,) if self.fleet is not None and self.fleet.confirmed else ()
        extras = (*state, *estimates, *control)
        if self.report_results is False:
            return (CAPABILITY_REQUEST_IDS, *extras)
        return (CAPABILITY_RESULTS, CAPABILITY_PROBES, CAPABILITY_REQUEST_IDS, *extras)

    @property
    def exit_code(self) -> int:
        """The process exit status a stop calls for: 130 after SIGINT (Ctrl-C), else 0 (SIGTERM or
        `stop()`: a stop that was asked for)."""
        return EXIT_SIGINT if self.stop_signal == signal.SIGINT else 0

    def stop(self, grace: float | None = None) -> None:
        """Stop polling; let running handlers finish within `grace` seconds (default: the worker's), then
        cancel them; release everything not processed. A second call stops at once. Safe before run()."""
        if grace is not None:
            self.grace = grace
        if self._stopping.is_set() or self.grace <= 0:
            self._stop_now.set()
        self._stopping.set()
        self._changed.set()

    def install_signal_handlers(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """SIGTERM/SIGINT call `stop()` (a second one stops at once); removed again when run() returns.
        Several workers of one event loop may install: one signal stops them all."""
        hub = _Signals.of(asyncio.get_running_loop())
        for sig in signals:
            hub.add(sig, self)

    async def run(self) -> None:
        """Poll and process until `stop()`; returns once every claim is acked or released."""
        if self._started:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started = True
        loop = asyncio.get_running_loop()
        try:
            if self._setup_error is not None:
                raise self._setup_error
            outbound = self.config.outbound_ssl()  # a CA file that is not there: ConfigError, nothing open
            self.config.gateway_ssl()
            self._gateway = EmoClient(
                self.config, self._api_key, timeout=self.gateway_timeout, key_setting=WORKER_KEY_SETTING
            )
            self._gateway.open()
            self._connector = aiohttp.TCPConnector(ssl=outbound)
            self._http = self._session(None)
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                self._poll_task = tg.create_task(self._poll_loop(), name=f"strictq-poll-{self.queue}")
                tg.create_task(self._drain_on_stop(), name=f"strictq-drain-{self.queue}")
                if self.fleet is not None:  # heartbeats and control messages (strictq.sdk.fleet)
                    tg.create_task(self.fleet.run(), name=f"strictq-fleet-{self.queue}")
        except* WorkerError as group:
            raise group.exceptions[0] from None
        finally:
            self._tg = None
            _Signals.of(loop).remove(self)  # the signals go back as they were once no worker needs them
            if self._http is not None:
                await self._http.close()
            if self._connector is not None:
                await self._connector.close()
            if self._gateway is not None:
                await self._gateway.close()
            self._http = None

    # ---------------------------------------------------------------------------------------- polling

    async def _poll_loop(self) -> None:
        gateway = self._gateway
        assert gateway is not None
        loop = asyncio.get_running_loop()
        backoff = MIN_BACKOFF
        while not self._stopping.is_set():
            free = self.concurrency - len(self._active)
            ahead = free <= 0 and self._pipeline is not None
            if ahead and self._pipeline is not None:  # every slot taken: claim ahead when it is time
                self._changed.clear()
                if await self._pipeline.prefetch(-free, self._changed) <= 0:
                    continue
                free = 1
            if free <= 0:
                self._changed.clear()
                await self._changed.wait()
                continue
            if (paused := self._paused_until - loop.time()) > 0:  # the egress proxy refused a call
                await self._sleep(paused)
                continue
            if self.fleet is not None and not self.fleet.awake.is_set():  # asleep or drained: no polls
                await self._until_awake(self.fleet.awake)
                continue
            started = loop.time()
            limit = min(self.limit, free)
            handover: list[str] | None = [] if self.local_state is not None else None

            async def poll(limit: int = limit, handover: list[str] | None = handover) -> list[PollItem]:
                if handover:
                    handover.clear()  # a retried poll: only its own answer counts
                return await gateway.poll(
                    self.queue,
                    ttl=self.ttl,
                    limit=limit,
                    wait=self.wait,
                    capabilities=self.capabilities,
                    version=self.version,
                    max_bytes=self.max_message_bytes,
                    handover=handover,
                    headers_seen=None if self.fleet is None else self.fleet.headers_seen,
                )

            try:  # transient failures are retried (full jitter, logged once per step): strictq.sdk.retry
                messages = await self._polls.call(poll, sleep=self._sleep, give_up=self._stopping.is_set)
            except GatewayError as exc:
                if isinstance(exc, MalformedPollItem) and exc.items:
                    await self._release_polled(exc.items, "the poll answer was malformed")
                if self._stopping.is_set() and transient(exc):
                    break
                self.stop(0)
                raise WorkerError(self._refused_poll(exc)) from exc
            self.stats.polls += 1
            self.stats.received += len(messages)
            if handover:
                self._export_state(handover)
            if self._pipeline is not None:
                self._pipeline.polled(loop.time() - started)
            if self.fleet is not None:
                self.fleet.note_poll(not messages)
                if messages and not self.fleet.awake.is_set():  # put to sleep or drained meanwhile
                    await self._release_polled(messages, f"worker {self.fleet.state}")
                    continue
            if messages and self._stopping.is_set():
                await self._release_polled(messages, "worker stopping")
                break
            if messages:
                backoff = MIN_BACKOFF
                self._dispatch(messages, started)
                continue
            elapsed = loop.time() - started
            if elapsed < backoff and ahead and self._pipeline is not None:  # nothing to claim ahead
                await self._pipeline.pause(backoff - elapsed, self._changed)  # until a slot frees
            elif elapsed < backoff:  # no long poll (or it answered early): back off, bounded
                await self._sleep(backoff - elapsed)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _refused_poll(self, error: GatewayError) -> str:
        """The one line for a poll that cannot succeed (strictq.sdk.run logs it and exits 1)."""
        who = f"worker {self.worker_id!r} on queue {self.queue!r}"
        if isinstance(error, SetupError):  # the message names the setting
            return f"{who}: {error}"
        if isinstance(error, MalformedPollItem):
            hint = "is STRICTQ_URL a strictq gateway?"
            return f"{who}: the gateway's poll answer cannot be read ({error}); {hint}"
        return f"the gateway refuses to let {who} poll: {error}"

    async def _until_awake(self, awake: asyncio.Event) -> None:
        """Wait until the fleet wakes the worker or it stops."""
        waits = {asyncio.ensure_future(awake.wait()), asyncio.ensure_future(self._stopping.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _dispatch(self, messages: Sequence[PollItem], claimed_at: float) -> None:
        assert self._tg is not None
        by_group: dict[str, list[PollItem]] = {}
        for item in messages:
            by_group.setdefault(item.group, []).append(item)
        for group, items in by_group.items():
            items.sort(key=lambda item: item.seq)
            previous = self._runs.get(group)
            if previous is not None and not previous.finished.is_set():
                # A new claim on a group this process still works on: the old token is stale.
                previous.lose("the group was claimed again with a newer token (this claim expired)")
            else:
                previous = None
            if self.local_state is not None:
                moved = next((i.state for i in items if i.state is not None), None)
                if moved is not None:  # the group moved here: its former worker's state replaces ours
                    self.local_state.take(group, moved)
            run = _GroupRun(self, group, items, claimed_at, previous)
            self._runs[group] = run
            self._active.add(run)
            run.task = self._tg.create_task(run.run(), name=f"strictq-{self.queue}-group-{group}")

    def _export_state(self, groups: Sequence[str]) -> asyncio.Task[None] | None:
        """Upload the local state of groups moving away from this worker (its poll answer named them)."""
        assert self._tg is not None
        fresh = [g for g in groups if g not in self._exporting]
        if not fresh:
            return None
        self._exporting.update(fresh)
        return self._tg.create_task(self._upload_state(fresh), name=f"strictq-state-{self.queue}")

    async def hand_over_state(self) -> int:
        """Upload the local state of every group this worker holds, waiting (at most `gateway_timeout`)
        for the uploads: what a drained worker does, since it polls no more and so cannot learn from its
        polls which groups to export (docs/state-transfer.md). Returns the groups whose state was taken."""
        local = self.local_state
        if local is None or self._tg is None or self.stopping:
            return 0
        groups = list(local.groups)
        task = self._export_state(groups) if groups else None
        if task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.gateway_timeout)
        return len(groups) - len(local.groups)

    async def _upload_state(self, groups: list[str]) -> None:
        """Each batch once, with bounded retries; a group the gateway took is forgotten here. A failure is
        logged: the gateway asks again on a later poll while the handover waits."""
        local, gateway = self.local_state, self._gateway
        assert local is not None and gateway is not None
        try:
            for batch in local.batches(groups):
                retry = Retry(f"state upload to {self.queue}", MIN_BACKOFF, MAX_ERROR_BACKOFF)
                deadline = asyncio.get_running_loop().time() + self.gateway_timeout
                try:
                    outcomes = await retry.call(
                        functools.partial(gateway.put_state, self.queue, batch),
                        deadline=deadline,
                        sleep=self._sleep,
                        give_up=self._stop_now.is_set,
                    )
                except GatewayError as exc:
                    log.warning(
                        "could not upload the state of %d group(s) of %s: %s", len(batch), self.queue, exc
                    )
                    continue
                local.forget(g for g, status in outcomes.items() if status == "ok")
        finally:
            self._exporting.difference_update(groups)

    def _run_finished(self, run: _GroupRun) -> None:
        self._active.discard(run)
        if self._runs.get(run.group) is run:
            del self._runs[run.group]
        self._changed.set()

    async def _release_polled(self, messages: Sequence[PollItem], reason: str) -> None:
        assert self._gateway is not None
        for token, ids in _by_token(messages).items():
            try:
                await self._gateway.release(self.queue, ids, token)
                self.stats.released += len(ids)
            except GatewayError as exc:
                log.warning("could not release %d message(s) of %s: %s", len(ids), self.queue, exc)
        self.stats.note(reason)
        log.info("released %d message(s) of %s unprocessed: %s", len(messages), self.queue, reason)

    # ---------------------------------------------------------------------------------------- stopping

    async def _drain_on_stop(self) -> None:
        await self._stopping.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self.grace, 0.0)
        while True:
            pending: set[asyncio.Task[Any]] = {r.task for r in self._active if r.task is not None}
            if self._poll_task is not None and not self._poll_task.done():
                pending.add(self._poll_task)
            if not pending:
                return
            if self._stop_now.is_set() or loop.time() >= deadline:
                for run in list(self._active):
                    run.abort("worker stopping: grace period over")
                await asyncio.wait(pending, timeout=0.5)
                continue
            stop_now = asyncio.create_task(self._stop_now.wait(), name=f"strictq-stop-now-{self.queue}")
            try:
                await asyncio.wait(
                    {*pending, stop_now}, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stop_now.cancel()

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stopping.is_set():
            log.warning("worker %s: %s received again: stopping at once", self.worker_id, name)
        else:
            self.stop_signal = sig
            log.warning(
                "worker %s: %s received: stopping (handlers in flight get %g s; %s again stops at once)",
                self.worker_id,
                name,
                self.grace,
                name,
            )
        self.stop()

    # ------------------------------------------------------------------------------ refusal backoff

    def _refused(self, what: str, epoch: int) -> None:
        """The egress proxy refused a call of an attempt at a claim polled in `epoch`: no poll for a while
        (full jitter). Claims polled before the backoff began are one episode: their refusals count once."""
        if epoch != self._refusal_epoch:
            return
        self._refusal_epoch += 1
        delay, grew = self._refusals.fail()
        loop = asyncio.get_running_loop()
        self._paused_until = max(self._paused_until, loop.time() + delay)
        if grew:  # once per step of the backoff, not per retry
            log.warning(
                "worker %s: the egress proxy refused a call (%s); backing off, up to %.1f s before the next "
                "poll (%d refusal(s) in a row)",
                self.worker_id,
                what,
                self._refusals.ceiling,
                self._refusals.failures,
            )

    def _passed(self, epoch: int) -> None:
        """A call of an attempt polled after the latest refusal passed the proxy: the backoff is over."""
        if epoch == self._refusal_epoch and (failures := self._refusals.succeed()):
            self._paused_until = 0.0
            log.info("worker %s: calls pass the proxy again after %d refusal(s)", self.worker_id, failures)

    # ---------------------------------------------------------------------------------------- helpers

    def _session(self, tags: Tags | None) -> aiohttp.ClientSession:
        assert self._connector is not None
        return tagged_session(
            self._connector, bound=tags, proxy_url=self._proxy_url, proxy_headers=self._proxy_headers
        )

    async def _invoke(self, message: Message, tags: Tags) -> BaseException | None:
        CURRENT.set(tags)  # this task's context: worker.http tags its calls too
        handler = self.probe_handler if message.probe and self.probe_handler is not None else self.handler
        try:
            if self.preprocess is None or message.probe:
                await handler(message)
            elif self._pipeline is not None:  # scheduled pre-processing, then a processing slot
                await self._pipeline.run(message, handler)
            else:
                await inline(self.preprocess, message, handler)
        except Exception as exc:  # the handler's failure is an outcome, not the task group's
            return exc
        return None

    def _unsupported(self, exc: GatewayError) -> None:
        if self.report_results is not False:
            log.warning("the gateway has no results route (%s): acking and releasing without log data", exc)
        self.report_results = False


class _GroupRun:
    """One claim on one group: its messages in seq order, one at a time, with a heartbeat."""

    def __init__(
        self,
        worker: Worker,
        group: str,
        messages: list[PollItem],
        claimed_at: float,
        previous: _GroupRun | None,
    ) -> None:
        self.worker = worker
        self.group = group
        self.held = messages  # claimed and neither acked nor released, in seq order
        self.expires = claimed_at + worker.ttl  # local, conservative: from when the poll was sent
        self.previous = previous
        self.probe = any(m.probe for m in messages)  # not a claim: no heartbeat
        self.finished = asyncio.Event()
        self.lost: str | None = None  # the claim is gone: nothing more to ack, renew or release
        self.release_reason: str | None = None
        self.retry_after = 0.0  # backoff before handing back after a failure (see Worker.retry_backoff)
        self.stop_reason: str | None = None
        self.current: Tags | None = None
        self.lock = asyncio.Lock()  # ack, renew and release never overlap (a renew must not name acked ids)
        self.task: asyncio.Task[None] | None = None
        self.epoch = worker._refusal_epoch  # the refusal backoff's episode this claim was polled in

    def lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self.worker.stats.lost += 1
            log.warning("claim on group %s of %s lost: %s", self.group, self.worker.queue, reason)
        if self.current is not None:
            self.current.abort(reason)

    def abort(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        if self.current is not None:
            self.current.abort(reason)

    async def run(self) -> None:
        worker = self.worker
        assert worker._tg is not None
        heartbeat = None
        if not self.probe:
            heartbeat = worker._tg.create_task(
                self._heartbeat(), name=f"strictq-heartbeat-{worker.queue}-{self.group}"
            )
        try:
            if self.previous is not None:
                await self.previous.finished.wait()
            while self.held and self.lost is None:
                if worker.stopping or self.stop_reason:
                    self.release_reason = self.stop_reason or "worker stopping"
                    break
                if not await self._process(self.held[0]):
                    if self.retry_after > 0 and self.lost is None and self.held:
                        await worker._sleep(self.retry_after)  # ends early when the worker stops
                    break
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            try:
                if self.held and self.lost is None:
                    await self._hand_back(self.release_reason or "worker stopping")
            finally:
                self.finished.set()
                worker._run_finished(self)

    async def _process(self, polled: PollItem) -> bool:
        """Run the handler on the group's next message and report how it went; False stops the group."""
        worker = self.worker
        assert worker._tg is not None
        attempt = polled.attempt
        token = polled.token if polled.token is not None else ""
        # X-Strictq-Queue echoes the item's queue_ref (the worker's queue name from an older gateway)
        tags = Tags(
            polled.queue_ref or worker.queue, polled.id, self.group, token, attempt, polled.request_id
        )
        session = worker._session(tags)
        probe = polled.probe
        message = Message(
            queue=worker.queue,
            id=polled.id,
            group=self.group,
            seq=polled.seq,
            token=token,
            attempt=attempt,
            payload=polled.payload,
            http=session,
            worker_id=worker.worker_id,
            raw=dict(polled.raw),
            probe=probe,
            history=polled.history,
            request_id=polled.request_id,
            estimate=polled.estimate,
        )
        if worker.local_state is not None:
            message.state = worker.local_state.of(self.group)
        self.current = tags
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = worker._tg.create_task(
            worker._invoke(message, tags), name=f"strictq-handler-{worker.queue}-{polled.id}"
        )
        tags.task = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            tags.abort("the worker was cancelled")
            raise
        finally:
            self.current = None
            await session.close()
        duration_ms = (loop.time() - started) * 1000
        if message.processing_ms is not None:  # pipelined: the handler's own time, not the waits
            duration_ms = message.processing_ms
        if probe:
            worker.stats.probes += 1
        error = None if task.cancelled() else task.result()
        if isinstance(error, NotStarted):  # the worker stopped before the handler began: hand it back
            self.release_reason = str(error)
            return False
        if error is None and not task.cancelled() and worker.local_state is not None and not probe:
            error = _state_error(worker.local_state, self.group)
        if tags.fenced is not None:  # a fenced or stale worker backs off instead of polling straight on
            worker._refused(f"{tags.fenced.action} for message {polled.id}", self.epoch)
        elif error is not None and _proxy_auth_refused(error):
            worker._refused(f"407 for message {polled.id}", self.epoch)
        elif tags.calls:
            worker._passed(self.epoch)
        if task.cancelled() or tags.aborted:
            reason = tags.abort_reason or "the handler was cancelled"
            worker.stats.failed += 1
            worker.stats.probes_failed += probe
            if tags.fenced is not None and tags.fenced.action == ACTION_STALE_LEASE:
                self.lose(f"message {polled.id}: {reason}")
            else:  # handed back at once (not_attempted): another worker takes it while this one backs off
                self.release_reason = f"message {polled.id}: {reason}"
            return False
        if error is None:
            return await self._succeeded(polled, message, duration_ms)
        worker.stats.failed += 1
        worker.stats.probes_failed += probe
        reason = f"message {polled.id} attempt {attempt}: handler raised {error!r}"
        log.warning(
            "handler failed on message %s (group %s of %s, attempt %s)%s: %s",
            polled.id,
            self.group,
            worker.queue,
            attempt,
            "" if len(self.held) == 1 else f"; handing back the group's {len(self.held) - 1} other(s)",
            failure_reason(error),
            exc_info=None if isinstance(error, AttemptFailed) else error,
        )
        if worker.report_results is not False:
            item = self._failed_item(polled, message, error, tags, duration_ms)
            why = f"an earlier message of the group failed ({polled.id})"
            rest = [
                result_item(r.id, r.token, "not_attempted", reason=why, request_id=r.request_id)
                for r in self.held[1:]
            ]
            if await self._report([item, *rest], reason) is not None:
                worker.stats.note(reason)
                return False
        # No results route: hold the claim for a backoff, then release (a poison message must not spin).
        self.release_reason = reason
        self.retry_after = self._backoff(attempt)
        return False

    def _failed_item(
        self, polled: PollItem, message: Message, error: BaseException, tags: Tags, duration_ms: float
    ) -> dict[str, Any]:
        partial = message.partial
        fields = dict(message.fields)
        if isinstance(error, AttemptFailed):
            partial = error.partial if error.partial is not None else partial
            fields.update(error.fields)
        progressed = bool(message.steps) or partial is not None
        return result_item(
            polled.id,
            polled.token,
            "partial" if progressed else "failed",
            reason=failure_reason(error),
            signature=failure_signature(error, tags.last_failed_call),
            steps=message.steps,
            partial=partial,
            fields=fields,
            duration_ms=duration_ms,
            request_id=polled.request_id,
            preprocess_ms=message.preprocess_ms,
        )

    async def _succeeded(self, polled: PollItem, message: Message, duration_ms: float) -> bool:
        worker = self.worker
        if worker.report_results is not False:
            item = result_item(
                polled.id,
                polled.token,
                "succeeded",
                steps=message.steps,
                partial=message.partial,
                fields=message.fields,
                duration_ms=duration_ms,
                request_id=polled.request_id,
                preprocess_ms=message.preprocess_ms,
            )
            reported = await self._report([item], f"message {polled.id} succeeded")
            if reported is not None:
                return reported
        if message.probe:  # without the results route a probe has nowhere to go
            self.held.pop(0)
            return True
        return await self._ack(polled)

    @staticmethod
    def _retry(what: str) -> Retry:
        """Retries of one ack or report: full jitter from 0.05 s up to 1 s, within the claim's ttl."""
        return Retry(what, MIN_BACKOFF, MAX_ERROR_BACKOFF)

    def _backoff(self, attempt: Any) -> float:
        base, ceiling = self.worker.retry_backoff
        return float(min(ceiling, base * 2 ** (max(1, int(attempt)) - 1)))

    async def _report(self, items: list[dict[str, Any]], what: str) -> bool | None:
        """Report results for the first len(items) held messages (in seq order) and drop them from `held`.
        True: all taken (for a single `succeeded`: it is deleted); False: the claim is gone or the report
        could not be made (the rest is handed back by `run`); None: the gateway has no results route."""
        worker = self.worker
        gateway = worker._gateway
        assert gateway is not None
        async with self.lock:
            try:  # transient failures retried within the claim's ttl (strictq.sdk.retry)
                statuses = await self._retry(f"report of {what}").call(
                    lambda: gateway.report(worker.queue, items), deadline=self.expires
                )
            except ResultsUnsupported as exc:
                worker._unsupported(exc)
                return None
            except GatewayError as exc:
                self.release_reason = f"report for {what} failed: {exc}"
                log.error("report of %s in %s failed: %s", what, worker.queue, exc)
                return False
            if worker.report_results is None:
                worker.report_results = True
            ok = True
            for polled, item, status in zip(self.held, items, statuses, strict=False):
                code = status.get("status")
                if code == "ok" or (code == "gone" and item["outcome"] == "succeeded"):
                    worker.stats.reported += code == "ok"
                    if polled.probe:
                        pass
                    elif item["outcome"] == "succeeded":
                        worker.stats.acked += 1
                    else:
                        worker.stats.released += 1
                elif code in ("stale_claim", "not_in_flight", "gone"):
                    self.lose(f"result for {item['id']} refused: {code} {status.get('message', '')}".strip())
                    ok = False
                else:
                    self.release_reason = f"result for {item['id']} refused: {code} {status.get('message')}"
                    log.error("%s in %s", self.release_reason, worker.queue)
                    ok = False
            if ok or self.lost is not None:
                del self.held[: len(items)]
        return ok

    async def _ack(self, polled: PollItem) -> bool:
        worker = self.worker
        gateway = worker._gateway
        assert gateway is not None
        async with self.lock:
            try:  # transient failures retried within the claim's ttl (strictq.sdk.retry)
                await self._retry(f"ack of {polled.id}").call(
                    lambda: gateway.ack(worker.queue, [polled.id], polled.token), deadline=self.expires
                )
            except LeaseRefused as exc:
                self.lose(f"ack of {polled.id} refused: {exc}")
                return False
            except GatewayError as exc:
                self.release_reason = f"ack of {polled.id} failed: {exc}"
                log.error("ack of %s in %s failed: %s", polled.id, worker.queue, exc)
                return False
            self.held.pop(0)
        worker.stats.acked += 1
        return True

    async def _hand_back(self, reason: str) -> None:
        """Everything still held goes back untouched, in order: reported `not_attempted` (the results
        route), else released (renew ttl 0)."""
        worker = self.worker
        held = list(self.held)
        if worker.report_results is not False:
            items = [
                result_item(r.id, r.token, "not_attempted", reason=reason, request_id=r.request_id)
                for r in held
            ]
            reported = await self._report(items, f"{len(items)} message(s) handed back")
            if reported is not None:
                if self.held and self.lost is None:  # refused: release what is left the old way
                    await self._release(reason)
                else:
                    worker.stats.note(reason)
                    log.info(
                        "handed back %d message(s) of group %s in %s (from %s): %s",
                        len(held),
                        self.group,
                        worker.queue,
                        held[0].id if held else "-",
                        reason,
                    )
                return
        await self._release(reason)

    async def _release(self, reason: str) -> None:
        worker = self.worker
        assert worker._gateway is not None
        async with self.lock:
            held, self.held = [r for r in self.held if not r.probe], []
            for token, ids in _by_token(held).items():
                try:
                    await worker._gateway.release(worker.queue, ids, token)
                    worker.stats.released += len(ids)
                except LeaseRefused as exc:
                    log.info("release of group %s refused (claim already gone): %s", self.group, exc)
                except GatewayError as exc:
                    log.warning("release of group %s failed (its claim will expire): %s", self.group, exc)
        worker.stats.note(reason)
        log.info(
            "released %d message(s) of group %s in %s (from %s): %s",
            len(held),
            self.group,
            worker.queue,
            held[0].id if held else "-",
            reason,
        )

    async def _heartbeat(self) -> None:
        """Renew the claim every `heartbeat_fraction` of the ttl while held; lose it when refused, or when
        renewals keep failing until the claim is about to expire."""
        worker = self.worker
        assert worker._gateway is not None
        loop = asyncio.get_running_loop()
        interval = worker.ttl * worker.heartbeat_fraction
        margin = worker.ttl * 0.05
        failing = False
        try:
            while True:
                deadline = self.expires - margin
                delay = min(interval / 4, 0.25) if failing else interval
                # Wake no later than halfway to the deadline, so a claim whose poll answered late (a loaded
                # gateway) still gets a renew attempt with time for its round trip before it is given up.
                delay = min(delay, (deadline - loop.time()) / 2)
                await asyncio.sleep(max(0.0, delay))
                if not self.held or self.lost is not None:
                    return
                if loop.time() >= deadline:
                    self.lose("the claim is about to expire and could not be renewed")
                    return
                started = loop.time()
                try:
                    async with self.lock:
                        if not self.held:
                            return
                        for token, ids in _by_token(self.held).items():
                            async with asyncio.timeout(max(deadline - loop.time(), 0.05)):
                                await worker._gateway.renew(worker.queue, ids, token, worker.ttl)
                except LeaseRefused as exc:
                    self.lose(f"heartbeat refused: {exc}")
                    return
                except GatewayError as exc:
                    if not transient(exc):  # e.g. the key was revoked: no renew can succeed
                        self.lose(f"heartbeat refused: {exc}")
                        return
                    failing = True
                    log.warning("heartbeat for group %s of %s failed: %s", self.group, worker.queue, exc)
                    continue
                except TimeoutError as exc:
                    failing = True
                    log.warning("heartbeat for group %s of %s failed: %s", self.group, worker.queue, exc)
                    continue
                failing = False
                self.expires = started + worker.ttl
                worker.stats.heartbeats += 1
        except Exception:  # never take the task group down; the claim will be treated as lost
            log.exception("heartbeat for group %s crashed", self.group)
            self.lose("the heartbeat crashed")


def run(*workers: Worker) -> int:
    """Run the workers in a new event loop until SIGTERM or Ctrl-C stops them gracefully (see
    `Worker.stop`: what they hold and have not finished is handed back, nothing counts as a failure) and
    return the exit status, without a traceback: 0 after SIGTERM, 130 after Ctrl-C (SIGINT), 1 when a
    worker could not go on (its `WorkerError` is logged as one line: a key the gateway refuses, a
    certificate it cannot verify, a queue name it refuses), 2 when the settings are missing or invalid
    (`ConfigError`, one line naming the STRICTQ_* variable). `raise SystemExit(run(worker))`."""
    return asyncio.run(serve(*workers))


async def serve(*workers: Worker) -> int:
    """`run` inside a running event loop (the main thread's: signal handlers are installed there)."""
    if not workers:
        raise ValueError("serve() needs at least one Worker")
    for worker in workers:
        worker.install_signal_handlers()
    status = 0
    try:
        async with asyncio.TaskGroup() as tg:
            for worker in workers:
                tg.create_task(worker.run(), name=f"strictq-worker-{worker.queue}")
    except* ConfigError as group:
        status = EXIT_CONFIG
        for line in dict.fromkeys(str(exc) for exc in group.exceptions):  # each setting once
            log.error("strictq worker: %s", line)
    except* WorkerError as group:
        status = status or EXIT_FAILED
        for line in dict.fromkeys(str(exc) for exc in group.exceptions):
            log.error("strictq worker: %s", line)
    return status or max(worker.exit_code for worker in workers)


class _Signals:
    """One event loop's signal handlers for the workers that installed them. `loop.add_signal_handler`
    keeps a single callback per signal, so the hub's callback stops every worker registered for it; the
    handler that was there before comes back once the last of them is gone."""

    _hubs: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Signals]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.workers: dict[int, list[Worker]] = {}
        self.previous: dict[int, Any] = {}

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Signals:
        hub = cls._hubs.get(loop)
        if hub is None:
            hub = cls._hubs[loop] = cls(loop)
        return hub

    def add(self, sig: int, worker: Worker) -> None:
        if sig not in self.workers:
            previous = signal.getsignal(sig)
            self.loop.add_signal_handler(sig, self._fire, sig)
            self.previous[sig] = previous
            self.workers[sig] = []
        if worker not in self.workers[sig]:
            self.workers[sig].append(worker)

    def remove(self, worker: Worker) -> None:
        for sig, workers in list(self.workers.items()):
            if worker in workers:
                workers.remove(worker)
            if workers:
                continue
            del self.workers[sig]
            previous = self.previous.pop(sig, None)
            with contextlib.suppress(Exception):  # the loop may be closing; the handler goes either way
                self.loop.remove_signal_handler(sig)
                if previous is not None:
                    signal.signal(sig, previous)
        if not self.workers:  # the hub refers to its loop: drop it so the loop can go
            self._hubs.pop(self.loop, None)

    def _fire(self, sig: int) -> None:
        for worker in list(self.workers.get(sig, ())):
            worker._on_signal(sig)


def _proxy_auth_refused(error: BaseException) -> bool:
    """The handler failed on a 407: the egress proxy does not take the worker's credential (or tenant)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, aiohttp.ClientResponseError) and current.status == 407:
            return True
        current = current.__cause__ or current.__context__
    return False


def _state_error(local: LocalState, group: str) -> BaseException | None:
    """Why the group's local state cannot be kept after a handler (over the limit, not JSON), or None."""
    try:
        local.check(group)
    except StateTooLarge as exc:
        return exc
    except (TypeError, ValueError) as exc:
        return StateTooLarge(f"the local state of group {group!r} is not JSON: {exc}")
    return None


def _by_token(messages: Iterable[PollItem]) -> dict[int | None, list[str]]:
    out: dict[int | None, list[str]] = {}
    for item in messages:
        out.setdefault(item.token, []).append(item.id)
    return out
