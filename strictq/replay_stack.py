"""One isolated replay run: an embedded queue, gateway and egress proxy that exist only for this run
(`run_isolated`, the `strictq replay` runner: fencing.replay.run.Runner).

- The queue core runs in this process (`QueueService` in a temporary directory) behind the real gateway
  app over TLS on 127.0.0.1 (a throw-away CA), with its control stream, and a `DeliveryLog` writing the
  run's `delivery` records and `ack`/`release` events to `<work-dir>/wirelog`.
- The egress proxy is `strictq proxy --replay-from <recording>` as a child: every call of the worker is
  answered from the recording or refused (503 `unmatched`); it follows this run's control stream (so
  stale leases are still refused) and captures the candidate's calls into the same `<work-dir>/wirelog`,
  redacted with the recording's `redaction.key` so body hashes compare.
- Messages are enqueued with their original ids and bodies, one message per group at a time in the
  original order (so each claim holds exactly one message and every delivery is one processing
  attempt); the next of a group goes in once the previous is acked, failed its last attempt (the queue
  dead-letters it after `attempts` receives) or timed out (`message_timeout`: deleted, its handler loses
  the claim).
- The worker command gets the client environment (docs/contracts.md: STRICTQ_URL, STRICTQ_CA_FILE,
  STRICTQ_API_KEY, STRICTQ_WORKER_ID, STRICTQ_WORKER_SECRET, STRICTQ_PROXY_URL, STRICTQ_PROXY_CA_FILE)
  and runs in its own process group; the whole group is stopped with SIGTERM (then SIGKILL after
  `grace`) when every message is done or `timeout` is over, and also when the worker has exited by
  itself: children it left behind (even ones ignoring SIGTERM) go with it. Everything started here is
  stopped here.
- A worker that exits before it took any message could not run: that is a RunError (`strictq replay`
  exits 2, naming the command, its exit code and the last line of its output), not a divergence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from access.tenancy import core_name
from fencing.replay.run import Progress, RunError, RunResult, RunSettings

log = logging.getLogger("strictq.replay")

READY_TIMEOUT = 30.0
POLL_INTERVAL = 0.05
DLQ_SUFFIX = "-replay-dlq"


@dataclass(slots=True)
class _Track:
    """One selected message in the run."""

    message_id: str
    queue: str  # as the worker names it
    internal: str  # the core's name
    group_key: str
    body: bytes
    content_type: str
    extra: bytes
    group: str | None
    state: str = "waiting"  # waiting | queued | delivered | done
    since: float = 0.0  # monotonic: when it became due (queued, delivered, released)
    deliveries: int = 0
    outcome: str | None = None


class IsolatedRun:
    def __init__(self, settings: RunSettings, messages: list[Any], progress: Progress | None = None) -> None:
        self.settings = settings
        self.messages = messages  # MessageStory, in original order
        self.progress = progress
        self.result = RunResult(
            settings.name,
            settings.command,
            settings.work_dir / "wirelog",
            settings.work_dir / "worker.log",
            settings.work_dir / "proxy.log",
            time.time(),
        )
        self._tracks: dict[str, _Track] = {}
        self._groups: dict[str, deque[_Track]] = {}
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._service: Any = None
        self._deliveries: Any = None
        self._tenant = "replay"

    # -------------------------------------------------------------------------------------------- run
    async def run(self) -> RunResult:
        """Set up, replay, tear down; raises RunError when the run cannot start at all."""
        settings = self.settings
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        self._tenant = next((m.tenant for m in self.messages if m.tenant), None) or "replay"
        with tempfile.TemporaryDirectory(prefix=f"strictq-replay-{settings.name}-") as tmp:
            async with contextlib.AsyncExitStack() as stack:
                gateway_url, ca, keys = await self._start_gateway(Path(tmp), stack)
                proxy = await self._start_proxy(Path(tmp), gateway_url, ca, keys, stack)
                await self._create_queues()
                for queue in self._groups.values():
                    await self._enqueue(queue[0])
                worker = await self._start_worker(gateway_url, ca, keys, proxy)
                stack.push_async_callback(self._stop_worker, worker)
                await self._watch(worker)
        self.result.finished_at = time.time()
        return self.result

    async def _start_gateway(self, tmp: Path, stack: contextlib.AsyncExitStack) -> tuple[str, Path, Any]:
        from aiohttp import web

        from access.keys import Credential, KeyRing, new_secret, write_keys
        from gateway.app import make_gateway_app
        from gateway.deliveries import DeliveryLog
        from gateway.tls import ensure_local_certificates, server_context
        from queue_core.control import ControlHub
        from queue_core.service import QueueService

        tenant = self._tenant
        credentials = [
            Credential(f"replay-{role}", new_secret(), role, tenant)
            for role in ("admin", "producer", "worker", "proxy")
        ]
        keys_path = tmp / "keys.toml"
        write_keys(keys_path, credentials)
        tls = ensure_local_certificates(tmp / "tls")
        assert tls.ca is not None
        service = QueueService(tmp / "queue", partitions=8)
        await service.start()
        stack.push_async_callback(service.close)
        self._service = service
        deliveries = DeliveryLog(
            self.result.wirelog,
            key_dir=self.settings.key_dir,
            redaction=self.settings.redaction,
            listener=self._on_record,
        )
        deliveries.start()
        stack.push_async_callback(deliveries.close)
        self._deliveries = deliveries
        keys = KeyRing(credentials)
        runner = web.AppRunner(
            make_gateway_app(service, keys, control=ControlHub(service), deliveries=deliveries),
            access_log=None,
            handle_signals=False,
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        stack.callback(service.stop_waiting)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(tls))
        await site.start()
        port = runner.addresses[0][1]
        return f"https://127.0.0.1:{port}", tls.ca, (keys_path, keys)

    async def _start_proxy(
        self, tmp: Path, gateway_url: str, ca: Path, keys: Any, stack: contextlib.AsyncExitStack
    ) -> Any:
        from fencing.child import ProxyStartError, start_proxy_child

        settings = self.settings
        extra = ["--replay-from", str(settings.recording)]
        if settings.mask_file is not None:
            extra += ["--replay-mask", str(settings.mask_file)]
        if settings.redaction is not None:
            extra += ["--redaction", str(settings.redaction)]
        log_file = stack.enter_context(open(self.result.proxy_log, "ab"))  # noqa: ASYNC230 - once, small
        try:
            proxy = await start_proxy_child(
                host="127.0.0.1",
                port=0,
                admin_port=0,
                data_dir=tmp / "proxy",
                keys=keys[0],
                control=gateway_url,
                control_ca=ca,
                wirelog=self.result.wirelog,
                redaction_key_dir=settings.key_dir,
                extra_args=extra,
                stderr=log_file,
            )
        except ProxyStartError as exc:
            where = self.result.proxy_log
            raise RunError(f"the replay proxy did not start: {exc} (its log: {where})") from None
        stack.push_async_callback(proxy.stop)
        await _wait_ready(proxy.admin_url + "/readyz")
        return proxy

    async def _create_queues(self) -> None:
        from gateway.sqs_messages import encode_extra
        from gateway.sqs_queues import FIFO_LABEL

        service = self._service
        created: set[str] = set()
        for story in self.messages:
            queue = story.queue or "replay"
            face = story.face or "emodb"
            internal = core_name(self._tenant, queue, "dedupq" if face == "dedupq" else "queue")
            if internal not in created:
                attributes: dict[str, Any] = {"kind": "dedup"} if face == "dedupq" else {}
                if face == "sqs" and queue.endswith(".fifo"):
                    attributes["labels"] = {FIFO_LABEL: "true"}
                dlq = internal + DLQ_SUFFIX
                await service.create_queue(dlq, dict(attributes))
                attributes.update(max_receive_count=self.settings.attempts, dead_letter_queue=dlq)
                await service.create_queue(internal, attributes)
                created.add(internal)
            extra = b""
            if face == "sqs":
                fifo = queue.endswith(".fifo")
                group = None if fifo else story.group
                extra = encode_extra(story.attributes or {}, {}, "replay", None, group)
            track = _Track(
                message_id=story.message_id,
                queue=queue,
                internal=internal,
                group_key=story.replay_group or f"~{story.message_id}",
                body=story.body or b"",
                content_type=story.content_type or "",
                extra=extra,
                group=story.replay_group,
            )
            self._tracks[track.message_id] = track
            self._groups.setdefault(track.group_key, deque()).append(track)
        if not self._tracks:
            self._done.set()

    async def _enqueue(self, track: _Track) -> None:
        from queue_core.machine import QueueError, SendRequest

        if track.state != "waiting":  # finished meanwhile (the run is ending)
            return
        request = SendRequest(
            body=track.body,
            group=track.group,
            message_id=track.message_id,
            content_type=track.content_type,
            extra=track.extra,
        )
        track.state, track.since = "queued", time.monotonic()
        try:
            (result,) = await self._service.send(track.internal, [request])
        except QueueError as exc:
            result = exc
        if isinstance(result, QueueError):
            self.result.notes.append(f"message {track.message_id}: could not be enqueued: {result}")
            self._finish(track, "not-replayed")

    async def _start_worker(
        self, gateway_url: str, ca: Path, keys: Any, proxy: Any
    ) -> asyncio.subprocess.Process:
        ring = keys[1]
        by_role = {c.role: c for c in ring.credentials}
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRICTQ_")}
        env.update(
            STRICTQ_URL=gateway_url,
            STRICTQ_CA_FILE=str(ca),
            STRICTQ_API_KEY=by_role["producer"].secret,
            STRICTQ_WORKER_ID=by_role["worker"].id,
            STRICTQ_WORKER_SECRET=by_role["worker"].secret,
            STRICTQ_PROXY_URL=proxy.url,
            STRICTQ_PROXY_CA_FILE=str(proxy.ca),
            STRICTQ_REPLAY=self.settings.name,  # a worker may log it; it must not change behaviour
            PYTHONUNBUFFERED="1",
        )
        with open(self.result.worker_log, "ab") as out:  # noqa: ASYNC230 - opening a log file, once
            try:
                return await asyncio.create_subprocess_exec(
                    *self.settings.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: stopped as a whole
                )
            except OSError as exc:
                command = shlex.join(self.settings.command)
                raise RunError(
                    f"the {self.settings.name} worker command cannot start: {command}: {exc.strerror or exc}"
                ) from None

    # ---------------------------------------------------------------------------------------- watching
    async def _watch(self, worker: asyncio.subprocess.Process) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.timeout
        exited = asyncio.create_task(worker.wait())
        done = asyncio.create_task(self._done.wait())
        try:
            while not self._done.is_set():
                finished, _ = await asyncio.wait({exited, done}, timeout=POLL_INTERVAL)
                if exited in finished and not self._done.is_set():
                    code = exited.result()
                    self.result.worker_exit = code
                    await asyncio.sleep(0.2)  # a delivery record may still be on its way
                    if not self._done.is_set() and not any(t.deliveries for t in self._tracks.values()):
                        raise RunError(self._could_not_start(code))
                    self.result.notes.append(
                        f"the {self.settings.name} worker exited with code {code} before every message was "
                        f"done (its output: {self.result.worker_log})"
                    )
                    for track in self._open():  # its last acks had the 0.2 s above
                        await self._time_out(track, f"worker exited with code {code}")
                    break
                if loop.time() >= deadline:
                    self.result.notes.append(f"overall timeout ({self.settings.timeout:g} s) reached")
                    for track in self._open():
                        await self._time_out(track, f"overall timeout of {self.settings.timeout:g} s")
                    break
                now, limit = time.monotonic(), self.settings.message_timeout
                for track in self._open():
                    if track.state in ("queued", "delivered") and now - track.since > limit:
                        await self._time_out(track, f"no outcome within {limit:g} s")
        finally:
            done.cancel()
            if not exited.done():
                exited.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task

    def _could_not_start(self, code: int) -> str:
        """One line: the command, its exit code and the last line it wrote (usually the reason)."""
        last = ""
        with contextlib.suppress(OSError):
            with open(self.result.worker_log, "rb") as out:
                out.seek(max(0, out.seek(0, os.SEEK_END) - 4096))
                lines = [line.strip() for line in out.read().decode(errors="replace").splitlines()]
            last = next((line for line in reversed(lines) if line), "")
        said = f": {last[:200]}" if last else ""
        return (
            f"the {self.settings.name} worker exited with code {code} before it took any message, so nothing "
            f"was replayed: {shlex.join(self.settings.command)}{said} (its output: {self.result.worker_log})"
        )

    def _open(self) -> list[_Track]:
        return [t for t in self._tracks.values() if t.state != "done"]

    async def _time_out(self, track: _Track, reason: str) -> None:
        """Record the timeout, take the message out of the queue (its handler loses the claim at its next
        heartbeat) and move its group on."""
        if track.state == "done":
            return
        if track.state == "delivered":
            self._deliveries.note(
                "replay-timeout",
                queue=track.queue,
                message_id=track.message_id,
                reason=reason,
                tenant=self._tenant,
            )
            outcome = "timeout"
        else:
            outcome = "not-replayed"
        if track.state != "waiting":
            with contextlib.suppress(Exception):
                await self._service.ack(track.internal, [(track.message_id, None)])
        self._finish(track, outcome)

    def _on_record(self, record: dict[str, Any]) -> None:
        """The run's delivery log, live: deliveries and how their claims ended."""
        track = self._tracks.get(record.get("message_id") or "")
        if track is None or track.state == "done":
            return
        kind = record.get("kind")
        if kind == "delivery":
            track.state, track.since = "delivered", time.monotonic()
            track.deliveries += 1
        elif kind == "event" and record.get("event") == "ack":
            self._finish(track, "ack")
        elif kind == "event" and record.get("event") == "release":
            self._failed(track)
        elif kind == "log" and record.get("status") in (None, "ok"):  # a reported attempt result
            outcome = record.get("outcome")
            if outcome == "succeeded":
                self._finish(track, "ack")
            elif outcome in ("failed", "partial"):
                self._failed(track)
            elif outcome == "not_attempted":
                track.state, track.since = "queued", time.monotonic()
                track.deliveries -= 1  # it goes back untouched

    def _failed(self, track: _Track) -> None:
        """A failed attempt: retried until `attempts`, then taken out of the queue (the queue's own
        dead-lettering may already have) so the group moves on."""
        if track.deliveries < self.settings.attempts:
            track.state, track.since = "queued", time.monotonic()
            return
        self._finish(track, "fail")
        task = asyncio.get_running_loop().create_task(self._remove(track))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _remove(self, track: _Track) -> None:
        with contextlib.suppress(Exception):
            await self._service.ack(track.internal, [(track.message_id, None)])

    def _finish(self, track: _Track, outcome: str) -> None:
        track.state, track.outcome = "done", outcome
        self.result.outcomes[track.message_id] = outcome
        if self.progress is not None:
            self.progress(track.message_id, outcome)
        group = self._groups[track.group_key]
        while group and group[0].state == "done":
            group.popleft()
        if group and group[0].state == "waiting":
            task = asyncio.get_running_loop().create_task(self._enqueue(group[0]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if all(t.state == "done" for t in self._tracks.values()):
            self._done.set()

    async def _stop_worker(self, worker: asyncio.subprocess.Process) -> None:
        """SIGTERM to its whole process group (the SDK hands its claims back), SIGKILL after the grace to
        whatever of the group is left: whether the worker still runs or has exited and left children."""
        await stop_group(worker, self.settings.grace)
        if self.result.worker_exit is None:
            self.result.worker_exit = worker.returncode


async def stop_group(leader: asyncio.subprocess.Process, grace: float) -> None:
    """Stop the process group `leader` leads (started with start_new_session): SIGTERM to the group, up
    to `grace` seconds for the leader and every other member to exit, then SIGKILL to what is left.
    The group outlives its leader while a member lives (and its id is not reused meanwhile), so this
    also reaches children of a leader that has already exited."""
    pgid = leader.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(leader.wait(), grace)
    while group_alive(pgid) and loop.time() < deadline:  # noqa: ASYNC110 - other processes, polled
        await asyncio.sleep(POLL_INTERVAL)
    if leader.returncode is None or group_alive(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    await leader.wait()


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies, dead and waiting to be reaped by whoever
    adopted them, do not count where /proc tells them apart)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


async def _wait_ready(url: str) -> None:
    """Until the proxy's control stream is synchronised (/readyz 200): tagged calls pass the guards."""
    import aiohttp

    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            if loop.time() >= deadline:
                raise RunError(f"the replay proxy did not synchronise with its control stream ({url})")
            await asyncio.sleep(0.1)


async def run_isolated(
    settings: RunSettings, messages: list[Any], progress: Progress | None = None
) -> RunResult:
    """fencing.replay.run.Runner: one run on a stack of its own."""
    return await IsolatedRun(settings, messages, progress).run()
