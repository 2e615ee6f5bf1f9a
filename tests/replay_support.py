"""A real recording for the replay tests, and a way to run `strictq replay` on it.

`make_recording` runs what production runs: a counting aiohttp backend (in a thread, so a
module-scoped fixture can share it), `strictq serve` (gateway with the core in-process, the egress
proxy as its child; delivery and http records land in <data-dir>/wirelog), the SDK producer, and
`examples/replay_worker.py` as a subprocess with serve's client.env. Nothing in the recording is
written by hand.

`run_replay` runs the real `strictq replay` command and returns its exit code, output and JSON report.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from kit.backend import Backend, BackendThread, SeenRequest
from kit.process import CLIENT_ENV, ROOT, ChildProcess, launch, strictq
from kit.until import until_sync

WORKER = ROOT / "examples" / "replay_worker.py"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0

# (queue, group, payload): customer-1 and customer-2 have two orders each (group order matters),
# order 5 fails its first attempt (a recorded failure for --outcome failed).
ORDERS: list[tuple[str, str, dict[str, Any]]] = [
    ("orders", "customer-1", {"order": 1, "sku": "apple", "amount": 10}),
    ("orders", "customer-1", {"order": 2, "sku": "pear", "amount": 20}),
    ("orders", "customer-2", {"order": 3, "sku": "plum", "amount": 30}),
    ("orders", "customer-2", {"order": 4, "sku": "fig", "amount": 40}),
    ("orders", "customer-3", {"order": 5, "sku": "kiwi", "amount": 50, "fail_first": True}),
]
STAMPED: list[tuple[str, str, dict[str, Any]]] = [
    ("stamped", "customer-9", {"order": 91, "sku": "lime", "amount": 9}),
    ("stamped", "customer-9", {"order": 92, "sku": "lime", "amount": 9}),
]


def _replay_answer(request: SeenRequest) -> dict[str, Any]:
    """What the example worker's backend answers: stock for `/inventory/<sku>`, a charge for `/charge`."""
    if request.path.startswith("/inventory/"):
        return {"sku": request.path.rsplit("/", 1)[1], "available": 7}
    if request.path == "/charge":
        order = orjson.loads(request.body)["order"]
        return {"charge_id": f"ch-{order}-{uuid.uuid4().hex[:8]}", "status": "ok"}
    return {"ok": True}


class CountingBackend(BackendThread):
    """The kit's backend on its own thread, answering as the example worker's services do; `accepted`
    counts every connection, so a replay proves no call left the machine."""

    def __init__(self) -> None:
        super().__init__(Backend(answer=_replay_answer))

    @property
    def accepted(self) -> int:
        return self.backend.accepted

    @property
    def requests(self) -> int:
        return len(self.backend.seen)

    def start(self) -> CountingBackend:
        super().start()
        return self


class Serve(ChildProcess):
    """`strictq serve --port 0` (with its egress proxy) as a subprocess; `env`: its client env file."""

    STOP_TIMEOUT = STOP_TIMEOUT
    data_dir: Path
    env: dict[str, str]


def start_serve(data_dir: Path) -> Serve:
    argv = strictq("serve", "--host", "127.0.0.1", "--port", "0", "--proxy-port", "0")
    serve = launch(
        [*argv, "--data-dir", str(data_dir)],
        data_dir.parent / "serve.log",
        wait_for=[CLIENT_ENV],
        timeout=START_TIMEOUT,
        make=Serve,
    )
    serve.data_dir, serve.env = data_dir, {}
    for raw in Path(serve.startup[CLIENT_ENV]).read_text().splitlines():
        if "=" in raw and not raw.startswith("#"):
            name, _, value = raw.partition("=")
            serve.env[name] = value
    return serve


@dataclass
class Recording:
    wirelog: Path
    key_dir: Path
    backend: CountingBackend
    ids: dict[int, str] = field(default_factory=dict)  # order number -> message id

    def id_of(self, order: int) -> str:
        return self.ids[order]


def worker_command(*args: str) -> str:
    return " ".join([sys.executable, str(WORKER), *args])


def _records(wirelog: Path) -> list[dict[str, Any]]:
    from wirelog.reader import read_records

    return list(read_records(wirelog)) if wirelog.exists() else []


def _record_queue(serve: Serve, backend: CountingBackend, entries: list[Any], *worker_args: str) -> None:
    """Send the entries with the SDK producer, run the worker until each is acked, stop it."""
    from strictq.sdk import ClientConfig, Entry, Producer

    async def send() -> None:
        config = ClientConfig.from_env(serve.env)
        async with Producer(config=config) as producer:
            results = await producer.send_batch([Entry(q, payload, group) for q, group, payload in entries])
            assert all(r.ok for r in results), results

    asyncio.run(send())
    queue_name = entries[0][0]
    env = {**os.environ, **serve.env, "REPLAY_EXAMPLE_BACKEND": backend.url, "PYTHONUNBUFFERED": "1"}
    with open(serve.data_dir.parent / f"worker-{queue_name}.log", "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, str(WORKER), "--queue", queue_name, *worker_args],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wirelog = serve.data_dir / "wirelog"

        def acked() -> bool:
            records = _records(wirelog)
            ids = {
                r["message_id"]
                for r in records
                if r.get("kind") == "delivery" and r.get("queue") == queue_name
            }
            done = {r["message_id"] for r in records if _acked(r)}
            return len(ids) == len(entries) and ids <= done

        until_sync(acked, 60, interval=0.1, what=f"the worker to ack every message of {queue_name}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(STOP_TIMEOUT)


def _acked(record: dict[str, Any]) -> bool:
    """An ack event, or a `succeeded` attempt result the core took (workers that report results)."""
    if record.get("kind") == "event":
        return record.get("event") == "ack"
    return (
        record.get("kind") == "log" and record.get("outcome") == "succeeded" and record.get("status") == "ok"
    )


def make_recording(base: Path, backend: CountingBackend) -> Recording:
    """A real production run recorded by `strictq serve` (gateway deliveries + proxy calls)."""
    data_dir = base / "serve"
    data_dir.mkdir(parents=True)
    serve = start_serve(data_dir)
    try:
        _record_queue(serve, backend, ORDERS)
        _record_queue(serve, backend, STAMPED, "--stamp")
    finally:
        serve.stop()
    wirelog = data_dir / "wirelog"
    recording = Recording(wirelog, data_dir, backend)
    for record in _records(wirelog):
        if record.get("kind") == "delivery":
            order = orjson.loads(record["body"])["order"]
            recording.ids[order] = record["message_id"]
    return recording


@dataclass
class ReplayRun:
    code: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None
    report_dir: Path

    def message(self, message_id: str) -> dict[str, Any]:
        assert self.report is not None
        return next(m for m in self.report["messages"] if m["message_id"] == message_id)

    @property
    def diverged(self) -> dict[str, list[str]]:
        """message id -> divergence kinds, for diverging messages."""
        assert self.report is not None
        return {m["message_id"]: m["kinds"] for m in self.report["messages"] if m["status"] == "diverged"}


def run_replay(recording: Recording, report_dir: Path, *args: str, timeout: float = 180) -> ReplayRun:
    """`strictq replay` on the recording (short timeouts), as a user runs it."""
    argv = [
        *(sys.executable, "-m", "strictq", "replay", "--wirelog", str(recording.wirelog)),
        *("--report", str(report_dir), "--no-progress", "--message-timeout", "20", "--timeout", "120"),
        *args,
    ]
    env = {**os.environ, "REPLAY_EXAMPLE_BACKEND": recording.backend.url, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    report_file = report_dir / "report.json"
    report = orjson.loads(report_file.read_bytes()) if report_file.exists() else None
    return ReplayRun(done.returncode, done.stdout, done.stderr, report, report_dir)
