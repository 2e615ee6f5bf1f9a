"""The worker's side of the fleet (docs/fleet.md): heartbeats with load and capabilities, and control
messages from the queue service applied at run time.

From its first answered poll on, every `fleet_interval` seconds (the answer may change it), the worker
posts a heartbeat to the gateway's `POST /fleet/v1/heartbeat`: its queue, version, declared capabilities
(CPUs, memory, the largest message it accepts), load (messages in flight of its concurrency, polls since
the last heartbeat and how many came back empty) and state. The answer carries the controls pending for
it; each is applied once (by id) and acknowledged on the next heartbeat, sent at once:

- `config` {concurrency, limit, ttl, wait}: changes those Worker settings (checked again here: a value the
  worker cannot take is `refused`);
- `log_level` {level}: the root logger's level;
- `sleep` / `wake`: stop polling (held work finishes; heartbeats go on) / poll again;
- `drain`: take nothing more, finish held work, then report `applied` ("drained") and stay drained;
- `upgrade` {version, args}: await the operator's hook `Worker(upgrade=async fn(version, args) -> str)`
  and report the version it returns (`failed` with the reason when it raises; `refused` without a hook).

A gateway without the route (404, an older one) or that refuses the heartbeat turns this off with one log
line; transient failures are retried at the next interval. Once a heartbeat worked, the worker declares
the `control` capability on its polls, and a poll answer with `X-Strictq-Control: pending` makes it
heartbeat at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from queue_core.machine import InvalidArgument
from queue_core.machine.fleet import LOG_LEVELS, check_config

from .client import EmoClient
from .errors import GatewayError, SetupError
from .retry import transient

log = logging.getLogger("strictq.sdk")
CAPABILITY_CONTROL = "control"
CONTROL_HEADER = "X-Strictq-Control"
UpgradeHook = Callable[[str, dict[str, Any]], Awaitable[str]]
REMEMBERED = 256  # acknowledgements kept, to answer a control delivered again after a lost answer
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the gateway's body cap: what a worker takes unless it says less


def machine_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_memory_mib() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return 0


class FleetWorker(Protocol):
    """What the agent reads and changes of its `strictq.sdk.worker.Worker` (no import: no cycle)."""

    queue: str
    version: str
    worker_id: str
    concurrency: int
    _gateway: EmoClient | None
    _active: set[Any]
    _stopping: asyncio.Event
    _changed: asyncio.Event

    @property
    def stopping(self) -> bool: ...

    async def hand_over_state(self) -> int: ...


class FleetAgent:
    """One worker's heartbeat loop and control handling; `Worker` owns it (`Worker(fleet=False)`: none)."""

    def __init__(
        self,
        worker: FleetWorker,
        interval: float,
        capabilities: Mapping[str, int],
        upgrade: UpgradeHook | None,
    ) -> None:
        self.worker = worker
        self.interval = interval
        self.capabilities = dict(capabilities)
        self.upgrade = upgrade
        self.state = "active"  # active | sleeping | draining | drained
        self.enabled = True  # False once the gateway showed it has no fleet route
        self.confirmed = False  # a heartbeat worked: declare `control` on polls
        self.awake = asyncio.Event()  # set while the worker may poll
        self.awake.set()
        self.heartbeats = 0
        self.polls = 0
        self.empty_polls = 0
        self.applied: OrderedDict[str, dict[str, Any]] = OrderedDict()  # id -> its acknowledgement
        self._unsent: list[dict[str, Any]] = []
        self._running: dict[str, asyncio.Task[None]] = {}  # drains and upgrades in progress
        self._poke = asyncio.Event()
        self._polled = asyncio.Event()  # a poll was answered: the key and the certificate work
        self._failing = False

    # ----------------------------------------------------------------------------------- the loop
    def poke(self) -> None:
        """Heartbeat now (a poll answer said controls are pending, or an acknowledgement is ready)."""
        self._poke.set()

    def note_poll(self, empty: bool) -> None:
        self._polled.set()
        self.polls += 1
        self.empty_polls += empty

    def headers_seen(self, headers: Mapping[str, str]) -> None:
        if headers.get(CONTROL_HEADER) == "pending":
            self.poke()

    async def run(self) -> None:
        worker = self.worker
        try:
            # The first heartbeat waits for the first answered poll: a key or certificate the gateway
            # refuses is then the poller's one error line, not a heartbeat's besides.
            await self._first(self._polled)
            while self.enabled and not worker.stopping:
                self._poke.clear()
                await self._beat()
                if not self.enabled:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._poked_or_stopping(), self.interval)
        finally:
            for task in self._running.values():
                task.cancel()

    async def _poked_or_stopping(self) -> None:
        await self._first(self._poke)

    async def _first(self, event: asyncio.Event) -> None:
        """Until `event` is set or the worker stops."""
        poke = asyncio.ensure_future(event.wait())
        stop = asyncio.ensure_future(self.worker._stopping.wait())
        try:
            await asyncio.wait({poke, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            poke.cancel()
            stop.cancel()

    def body(self) -> dict[str, Any]:
        worker = self.worker
        in_flight = sum(len(run.held) for run in worker._active)
        return {
            "queues": [worker.queue],
            "version": worker.version,
            "interval": self.interval,
            "capabilities": self.capabilities,
            "load": {
                "in_flight": in_flight,
                "concurrency": worker.concurrency,
                "polls": self.polls,
                "empty_polls": self.empty_polls,
            },
            "state": self.state,
            "acks": list(self._unsent),
        }

    async def _beat(self) -> None:
        gateway = self.worker._gateway
        assert gateway is not None
        body = self.body()
        sent = len(self._unsent)
        try:
            answer = await gateway.heartbeat(body)
        except SetupError:  # the key or the certificate: the poller reports it (one line), then stops
            self.enabled = False
            return
        except GatewayError as exc:
            if transient(exc):
                if not self._failing:
                    log.warning("worker %s: heartbeat failed (retrying): %s", self.worker.worker_id, exc)
                self._failing = True
                return
            self.enabled = False
            self.awake.set()
            log.info(  # an older gateway, or one in front of a queue server: not the worker's problem
                "worker %s: the gateway takes no fleet heartbeats (%s): running without fleet control",
                self.worker.worker_id,
                exc,
            )
            return
        if self._failing:
            log.info("worker %s: heartbeats work again", self.worker.worker_id)
        self._failing = False
        self.confirmed = True
        self.heartbeats += 1
        del self._unsent[:sent]
        self.polls = self.empty_polls = 0
        if isinstance(answer, dict):
            interval = answer.get("interval")
            if isinstance(interval, int | float) and not isinstance(interval, bool) and interval > 0:
                self.interval = float(interval)
            for control in answer.get("controls") or []:
                if isinstance(control, dict):
                    self._take(control)
        if self._unsent:
            self.poke()

    # ------------------------------------------------------------------------------------ controls
    def _take(self, control: dict[str, Any]) -> None:
        control_id = control.get("id")
        if not isinstance(control_id, str):
            return
        if control_id in self.applied:  # our acknowledgement was lost: say it again
            self._ack_again(control_id)
            return
        if control_id in self._running:
            return
        kind, args = control.get("kind"), control.get("args")
        if not isinstance(args, dict):
            args = {}
        if kind in ("drain", "upgrade"):  # they take time: heartbeats go on meanwhile
            task = asyncio.get_running_loop().create_task(
                self._slow(control_id, str(kind), args), name=f"strictq-fleet-{kind}-{control_id}"
            )
            self._running[control_id] = task
            return
        status, detail = self._apply(kind, args)
        self._ack(control_id, status, detail)

    def _apply(self, kind: Any, args: dict[str, Any]) -> tuple[str, str]:
        worker = self.worker
        if kind == "config":
            try:
                values = check_config(args, "args")
            except InvalidArgument as exc:
                return "refused", str(exc)
            if not values:
                return "refused", "nothing to change"
            for name, value in values.items():
                setattr(worker, name, value)
            worker._changed.set()  # a larger concurrency lets the poller go on at once
            return "applied", ", ".join(f"{k}={v:g}" for k, v in values.items())
        if kind == "log_level":
            level = args.get("level")
            if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
                return "refused", f"level must be one of {', '.join(LOG_LEVELS)}"
            logging.getLogger().setLevel(level.upper())
            return "applied", f"log level {level.upper()}"
        if kind == "sleep":
            self.state = "sleeping"
            self.awake.clear()
            return "applied", "sleeping: polls stopped, heartbeats go on"
        if kind == "wake":
            self.state = "active"
            self.awake.set()
            worker._changed.set()
            return "applied", "active: polling again"
        return "refused", f"unknown control kind {kind!r}"

    async def _slow(self, control_id: str, kind: str, args: dict[str, Any]) -> None:
        try:
            if kind == "drain":
                status, detail, version = *(await self._drain()), None
            else:
                status, detail, version = await self._upgrade(args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never take the worker down for a control
            status, detail, version = "failed", f"{type(exc).__name__}: {exc}", None
        finally:
            self._running.pop(control_id, None)
        self._ack(control_id, status, detail, version)

    async def _drain(self) -> tuple[str, str]:
        worker = self.worker
        self.state = "draining"
        self.awake.clear()
        held = len(worker._active)
        while worker._active and not worker.stopping:
            with contextlib.suppress(TimeoutError):  # a finished run sets `_changed`; bounded anyway
                await asyncio.wait_for(worker._changed.wait(), 0.1)
        exported = await worker.hand_over_state()
        self.state = "drained"
        moved = f"; the local state of {exported} group(s) handed over" if exported else ""
        return "applied", f"drained: {held} held group(s) finished, taking nothing more{moved}"

    async def _upgrade(self, args: dict[str, Any]) -> tuple[str, str, str | None]:
        if self.upgrade is None:
            return "refused", "no upgrade hook: Worker(upgrade=async fn(version, args) -> str)", None
        wanted = args.get("version")
        if not isinstance(wanted, str) or not wanted:
            return "refused", "upgrade needs args.version", None
        hook_args = args.get("args")
        now_running = await self.upgrade(wanted, dict(hook_args) if isinstance(hook_args, dict) else {})
        if not isinstance(now_running, str) or not now_running:
            return "failed", f"the upgrade hook returned {now_running!r}, not a version", None
        self.worker.version = now_running
        return "applied", f"running {now_running}", now_running

    def _ack(self, control_id: str, status: str, detail: str, version: str | None = None) -> None:
        ack: dict[str, Any] = {"id": control_id, "status": status, "detail": detail[:500]}
        if version is not None:
            ack["version"] = version
        self.applied[control_id] = ack
        while len(self.applied) > REMEMBERED:
            self.applied.popitem(last=False)
        self._unsent.append(ack)
        (log.info if status == "applied" else log.warning)(
            "worker %s: control %s %s: %s", self.worker.worker_id, control_id, status, detail
        )
        self.poke()

    def _ack_again(self, control_id: str) -> None:
        ack = self.applied[control_id]
        if ack not in self._unsent:
            self._unsent.append(ack)
            self.poke()
