"""The cluster scenario (issue 15): `strictq cluster up` on this machine, measured three ways.

1. Throughput: the gw-emodb load (the same generator, the EmoDB face, batch 10, 100 groups) through the
   cluster's gateway with 1, 2 and 3 queue servers, at R1 (`--replicas 1`, one JetStream server) and R3
   (three JetStream servers), beside the single-process gateway (`strictq serve`, core in-process) under the
   same load in the same run. A cluster starts with one queue server (`cluster up --nodes 1`); the second
   and third are started by hand (`strictq queue-server --cluster ...`, as docs/cluster.md adds a node) and
   the master's rebalancing gives each its share before the next figure. CPU is read per process (gateway,
   each queue server, each nats-server) over the measured window: that is the profile of where time goes.
2. Failover: with a light open-loop load running (a send every 50 ms per partition, each partition's own
   groups, and two consumers draining), SIGKILL the owner of a partition; the failover time is from the
   kill to the first successful send to that partition that *started* after the kill (so the new owner
   served it). The killed queue server is restarted by hand and the cluster left to settle (rebalanced)
   before the next kill. At the end the consumers drain: every acknowledged send must come back (0 lost).
3. Planned moves: `strictq cluster move P NODE` under the same load; the CLI's own figure (request ->
   the target serves the partition) and the longest send to that partition seen by the client meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import LoadSummary, run_load
from .procstat import CpuSample, cpu_sample, machine_cpu, machine_facts
from .scenarios import Progress, Settings, _gateway_spec, _summary, measured
from .servers import GatewayServer, QueueServer, strictq_command

FACE = "emodb"  # the single-process gateway figure (gw-emodb, the gateway target) uses the EmoDB face
PARTITIONS = 3
R3_TARGET = 0.6  # R3 end-to-end rate / single-process gateway rate, same run
FAILOVER_MEDIAN_S, FAILOVER_MAX_S = 1.0, 2.0  # issue 28: median and max over the kills
PROBE_QUEUE = "failover"
PROBE_INTERVAL = 0.05  # one send per partition every 50 ms (open loop: each send its own task)
PROBE_GROUPS = 4  # groups per partition the probe's sends rotate over
PROBE_TTL = 5  # claim lease of the probe's consumers: a claim lost with its owner comes back soon
SETTLE_TIMEOUT = 90.0
CLUSTER_START_TIMEOUT = 180.0
NODE_START_TIMEOUT = 90.0
DRAIN_TIMEOUT = 60.0
MOVED = re.compile(r"moved to (\S+) \(epoch (\d+)\) in ([0-9.]+)s")


# ------------------------------------------------------------------------------------- processes
class ClusterServer(GatewayServer):
    """`strictq cluster up --port 0 ...`: start() returns on `strictq: cluster ready`; the gateway's lines
    (listening on, ca, keys) are relayed by cluster up, so url, ca and credentials() work as for serve."""

    SUBCOMMAND = "cluster up"
    READY = "strictq: cluster ready"

    def cli(self, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*strictq_command(), "cluster", *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def status(self) -> dict[str, Any]:
        """`strictq cluster status --json` (a few tries: a read may time out while JetStream elects)."""
        last = ""
        for _ in range(5):
            done = self.cli("status", "--json")
            if done.returncode == 0:
                data: dict[str, Any] = json.loads(done.stdout)
                return data
            last = done.stderr.strip()
            time.sleep(0.5)
        raise RuntimeError(f"strictq cluster status failed: {last}")

    def node_args(self, name: str) -> list[str]:
        """What `strictq queue-server` needs to join this cluster as `name` (its store in nodes/<name>)."""
        urls = self.cli("urls").stdout.strip()
        if not urls:
            raise RuntimeError(f"strictq cluster urls printed nothing for {self.data_dir}")
        return ["--cluster", urls, "--nats-credentials", str(self.data_dir / "nats" / "credentials"),
                "--internal-secret", str(self.data_dir / "internal.secret"),  # cluster up wrote it
                "--node", name]  # fmt: skip

    def processes(self) -> dict[str, int]:
        """name -> pid of what cluster up started and still runs: `gateway`, `node nK`, `nats nK`."""
        found: dict[str, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = [
                    a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a
                ]
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != self.pid or not argv:
                continue
            if "serve" in argv:
                found["gateway"] = int(entry.name)
            elif "queue-server" in argv and "--node" in argv:
                found[f"node {argv[argv.index('--node') + 1]}"] = int(entry.name)
            elif argv[0].endswith("nats-server"):
                found[f"nats {Path(argv[-1]).parent.name}"] = int(entry.name)
        return found


class ClusterNode(QueueServer):
    """A queue server joining a running cluster by hand (`strictq queue-server --cluster ... --node N`)."""

    READY = "strictq: node "


class Nodes:
    """The queue servers this benchmark started (or restarted) itself: stopped by it, by pid."""

    def __init__(self, cluster: ClusterServer, st: Settings, tag: str) -> None:
        self.cluster = cluster
        self.st = st
        self.tag = tag
        self.started: dict[str, ClusterNode] = {}
        self.count = 0

    def start(self, name: str) -> ClusterNode:
        self.count += 1
        node = ClusterNode(
            self.cluster.data_dir / "nodes" / name,
            self.st.out_dir / f"cluster-{self.tag}-{name}-{self.count}.log",
            extra_args=self.cluster.node_args(name),
        )
        node.start(NODE_START_TIMEOUT)
        self.started[name] = node
        return node

    def killed(self, name: str) -> None:
        """Reap a node of ours that was just SIGKILLed."""
        node = self.started.pop(name, None)
        if node is not None:
            node.stop(10)

    def pids(self) -> dict[str, int]:
        return {f"node {name}": n.pid for name, n in self.started.items() if n.proc and n.proc.poll() is None}

    def stop(self) -> None:
        for node in self.started.values():
            node.stop(30)
        self.started.clear()


def wait_settled(
    cluster: ClusterServer, nodes: list[str], *, balanced: bool = True, timeout: float = SETTLE_TIMEOUT
) -> tuple[bool, dict[str, Any]]:
    """Until every partition is served by a live owner with no move pending, every node in `nodes` alive,
    and (`balanced`) no node owning two partitions more than another. (ok, the last status)."""
    deadline = time.monotonic() + timeout
    data: dict[str, Any] = {}
    while time.monotonic() < deadline:
        data = cluster.status()
        if settled(data, nodes, balanced):
            return True, data
        time.sleep(0.5)
    return False, data


def settled(data: dict[str, Any], nodes: list[str], balanced: bool) -> bool:
    alive = {n["node"] for n in data["nodes"] if n["state"] == "alive"}
    if not set(nodes) <= alive:
        return False
    if not all(p["serving"] and p["moving_to"] is None for p in data["partitions"]):
        return False
    owned = Counter(p["owner"] for p in data["partitions"])
    counts = [owned.get(n, 0) for n in nodes]
    return not balanced or max(counts) - min(counts) <= 1


# ------------------------------------------------------------------------------------ throughput
@dataclass
class CpuWindow:
    """CPU seconds of named processes over the generators' measured window (on_window opens it; a timer
    closes it `seconds` later, while the generators are still counting)."""

    pids: dict[str, int]
    before: dict[str, CpuSample] = field(default_factory=dict)
    after: dict[str, CpuSample] = field(default_factory=dict)
    machine: tuple[float, float] = (0.0, 0.0)
    timer: threading.Timer | None = None

    def open(self, seconds: float) -> None:
        self.before = self._sample()
        busy, total = machine_cpu()
        self.machine = (busy, total)
        self.timer = threading.Timer(seconds, self._close)
        self.timer.start()

    def _close(self) -> None:
        self.after = self._sample()
        busy, total = machine_cpu()
        self.machine = (busy - self.machine[0], total - self.machine[1])

    def _sample(self) -> dict[str, CpuSample]:
        out: dict[str, CpuSample] = {}
        for name, pid in self.pids.items():
            try:
                out[name] = cpu_sample(pid)
            except OSError:
                pass
        return out

    def cores(self, seconds: float) -> dict[str, dict[str, float]]:
        """name -> {"total", "main"} cores over the window."""
        if self.timer is not None:
            self.timer.join()
        return {
            name: {
                "total": (self.after[name].total - self.before[name].total) / seconds,
                "main": (self.after[name].main - self.before[name].main) / seconds,
            }
            for name in self.before
            if name in self.after
        }

    def busy(self) -> float:
        """Fraction of the machine's cores busy in the window."""
        busy, total = self.machine
        return busy / total if total else 0.0


def measure(st: Settings, spec: Any, pids: dict[str, int], progress: Progress, label: str) -> dict[str, Any]:
    """`repeat` closed-loop runs; the median by end-to-end rate is kept, with every process's CPU."""
    runs: list[tuple[LoadSummary, dict[str, dict[str, float]], float]] = []
    for i in range(st.repeat):
        window = CpuWindow(dict(pids))
        summary = run_load(spec, st.procs, pids.get("gateway"), on_window=window.open)
        runs.append((summary, window.cores(summary.duration), window.busy()))
        if st.repeat > 1:
            progress(f"    {label} run {i + 1}/{st.repeat}: {summary.ack_rate:,.0f} msg/s")
    ordered = sorted(runs, key=lambda r: r[0].ack_rate)
    summary, cpu, busy = ordered[(len(ordered) - 1) // 2]
    summary.runs = [(s.ack_rate, s.other_cores, s.server_us_per_message()) for s, _, _ in runs]
    roles = role_cores(cpu)
    total = sum(roles.values())
    us = 1e6 * total * summary.duration / summary.acked if summary.acked else float("nan")
    progress(
        f"  {label}: {summary.ack_rate:,.0f} msg/s end-to-end; CPU cores "
        + ", ".join(f"{k} {v:.2f}" for k, v in roles.items())
        + f" (servers {us:.0f} µs/msg); generators {summary.generator_cores:.2f}; machine busy"
        f" {100 * busy:.0f}%; errors {summary.errors}"
    )
    if summary.first_errors:
        progress(f"    first errors: {summary.first_errors[:2]}")
    return _summary(summary, cpu=cpu, roles=roles, servers_us_per_message=us, machine_busy_window=busy)


def role_cores(cpu: dict[str, dict[str, float]]) -> dict[str, float]:
    """Cores per role: gateway, queue servers (all), nats-servers (all)."""
    roles = {"gateway": 0.0, "queue servers": 0.0, "nats-servers": 0.0}
    for name, c in cpu.items():
        key = (
            "gateway" if name == "gateway" else "queue servers" if name.startswith("node") else "nats-servers"
        )
        roles[key] += c["total"]
    return roles


def single_gateway(st: Settings, progress: Progress) -> dict[str, Any]:
    progress("  single-process gateway (`strictq serve`, core in-process): the reference, same load")
    gw = GatewayServer(st.work_dir / "cluster-single" / "data", st.out_dir / "cluster-single.server.log")
    try:
        gw.start()
        spec = _gateway_spec(st, FACE, gw)
        return measure(st, spec, {"gateway": gw.pid}, progress, "single-process gateway")
    finally:
        gw.stop()


def cluster_args(replicas: int, nodes: int) -> list[str]:
    nats = "1" if replicas == 1 else "3"
    return ["--nodes", str(nodes), "--replicas", str(replicas), "--partitions", str(PARTITIONS),
            "--nats-servers", nats, "--no-proxy"]  # fmt: skip


def start_cluster(st: Settings, tag: str, replicas: int) -> ClusterServer:
    cluster = ClusterServer(
        st.work_dir / f"cluster-{tag}" / "c",
        st.out_dir / f"cluster-{tag}.log",
        extra_args=cluster_args(replicas, 1),
    )
    started = time.perf_counter()
    cluster.start(CLUSTER_START_TIMEOUT)
    cluster.startup_seconds = time.perf_counter() - started
    return cluster


def throughput(
    st: Settings, progress: Progress, replicas: int, single_rate: float, after: Callable[..., Any] | None
) -> tuple[list[dict[str, Any]], Any]:
    """1, 2 and 3 queue servers at `replicas`; `after(cluster, nodes)` runs on the 3-node cluster."""
    tag = f"r{replicas}"
    nats = 1 if replicas == 1 else 3
    progress(
        f"  R{replicas}: cluster up --nodes 1 ({nats} nats-server{'s' if nats > 1 else ''}), then n2, n3"
    )
    figures: list[dict[str, Any]] = []
    extra: Any = None
    cluster = start_cluster(st, tag, replicas)
    nodes = Nodes(cluster, st, tag)
    try:
        progress(f"    cluster ready in {cluster.startup_seconds:.1f}s")
        spec = _gateway_spec(st, FACE, cluster)
        names = ["n1"]
        for count in (1, 2, 3):
            if count > 1:
                name = f"n{count}"
                started = time.perf_counter()
                nodes.start(name)
                names.append(name)
                ok, _ = wait_settled(cluster, names)
                progress(
                    f"    {name} joined; {'rebalanced' if ok else 'NOT rebalanced'} after"
                    f" {time.perf_counter() - started:.1f}s"
                )
            pids = {**cluster.processes(), **nodes.pids()}
            figure = measure(st, spec, pids, progress, f"R{replicas}, {count} queue server(s)")
            figure.update(replicas=replicas, nodes=count, ratio=figure["ack_rate"] / single_rate)
            figures.append(figure)
        if replicas == 3 and figures[-1]["ratio"] < R3_TARGET:
            progress("    R3 below target: one more run with py-spy on the gateway and queue servers")
            figures[-1]["profile"] = profile_run(st, spec, pids, progress)
        if after is not None:
            extra = after(cluster, nodes)
    finally:
        nodes.stop()
        cluster.stop()
    return figures, extra


# ------------------------------------------------------------------------------------- profile
# (test on a Python frame's file, category): the innermost frame that matches names the sample's owner.
PACKAGES = (
    ("cluster/replicated_log.py", "cluster: replicated log (JetStream appends)"),
    ("cluster/follower.py", "cluster: standby follower (applying frames)"),
    ("cluster/codec.py", "cluster: frame codec (msgpack)"),
    ("cluster/backend.py", "cluster: gateway backend (routing, fan-out)"),
    ("cluster/", "cluster: other (node, owners, master, KV)"),
    ("nats/", "nats-py client"),
    ("msgpack", "cluster: frame codec (msgpack)"),
    ("queue_core/remote.py", "queue_core.remote (gateway -> node client)"),
    ("queue_core/client.py", "queue_core.remote (gateway -> node client)"),
    ("queue_core/machine/", "core state machine"),
    ("queue_core/store.py", "SQLite store"),
    ("queue_core/durability.py", "service shell, durable log"),
    ("queue_core/service.py", "service shell, durable log"),
    ("queue_core/server.py", "internal API handlers (queue_core.server)"),
    ("queue_core/", "queue_core: other"),
    ("wirelog/", "wire log"),
    ("gateway/", "gateway faces"),
    ("ssl.py:", "TLS"),
    ("sslproto", "TLS"),
    ("aiohttp/", "aiohttp (HTTP server and client)"),
    ("multidict", "aiohttp (HTTP server and client)"),
    ("yarl/", "aiohttp (HTTP server and client)"),
    ("asyncio/", "event loop, tasks (asyncio/uvloop)"),
    ("uvloop", "event loop, tasks (asyncio/uvloop)"),
)
IDLE = "idle (waiting in epoll, on a lock or for work)"
GIL = "waiting for the GIL"
DISK = "waiting on the disk (fsync)"


def classify(frames: list[str]) -> str:
    """One py-spy sample of a thread -> where its time went: a wait (idle, the GIL, the disk), or the
    innermost package on the stack."""
    from .profiling import _native_after_python, _python_frames

    leaf = frames[-1]
    native = " ".join(_native_after_python(frames))
    if "take_gil" in native:
        return GIL
    if any(w in native or w in leaf for w in ("fsync", "fdatasync")):
        return DISK
    waits = (
        "epoll_wait",
        "epoll_pwait",
        "SimpleQueue_get",
        "PyThread_acquire_lock",
        "pthread_cond",
        "select",
    )
    if any(w in native or w in leaf for w in waits):
        return IDLE
    if "sqlite3" in native:
        return "SQLite store"
    if any("gc_collect" in f for f in frames):
        return "garbage collection"
    if "orjson" in native:
        return "orjson"
    for frame in reversed(_python_frames(frames)):
        for test, category in PACKAGES:
            if test in frame:
                return category
    if leaf.split(" (")[0] in ("write", "writev", "read", "recv", "send", "sendmsg", "recvmsg"):
        return "socket syscalls"
    return "other"


def analyze(raw: Path) -> dict[str, float]:
    """Category -> share of the process's on-CPU samples (every thread; idle, GIL and disk waits left
    out)."""
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            counts[classify(stack.split(";")[1:] or [stack])] += int(count)
    for wait in (IDLE, GIL, DISK):
        counts.pop(wait, None)
    busy = sum(counts.values())
    return {k: v / busy for k, v in counts.most_common()} if busy else {}


def profile_run(st: Settings, spec: Any, pids: dict[str, int], progress: Progress) -> dict[str, Any]:
    """One more load run (not counted: sampling pauses the processes) with py-spy on the gateway and each
    queue server for the window."""
    from .profiling import pyspy_binary, start_pyspy

    if pyspy_binary() is None:
        return {}
    targets = {name: pid for name, pid in pids.items() if not name.startswith("nats")}
    raws = {name: st.out_dir / f"cluster-profile-{name.replace(' ', '-')}.pyspy.txt" for name in targets}
    spies: list[subprocess.Popen[bytes]] = []

    def attach(seconds: float) -> None:
        for name, pid in targets.items():
            raws[name].unlink(missing_ok=True)
            spies.append(start_pyspy(pid, seconds, raws[name]))

    try:
        summary = run_load(spec, st.procs, pids.get("gateway"), on_window=attach)
        for spy in spies:
            spy.communicate(timeout=60)
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.kill()
                spy.wait(10)
    shares = {name: analyze(raws[name]) for name in targets}
    for name, share in shares.items():
        top = ", ".join(f"{k} {100 * v:.0f}%" for k, v in list(share.items())[:5])
        progress(f"    py-spy {name}: {top}")
    return {"ack_rate": summary.ack_rate, "shares": shares}


# -------------------------------------------------------------------------------- failover probe
@dataclass
class Op:
    partition: int
    started: float
    finished: float
    ok: bool


class Probe:
    """The light load of the failover and move figures: an open-loop sender per partition (its own
    groups) and two consumers, on the EmoDB face, recording every send and every delivery by id."""

    def __init__(self, url: str, ca: str, producer: str, workers: list[str]) -> None:
        from queue_core.machine.groups import partition_of

        self.url = url.rstrip("/")
        self.ca = ca
        self.producer = producer
        self.workers = workers
        self.groups: list[list[str]] = [[] for _ in range(PARTITIONS)]
        n = 0
        while min(len(g) for g in self.groups) < PROBE_GROUPS:
            group = f"fo{n}"
            n += 1
            bucket = self.groups[partition_of(group, PARTITIONS)]
            if len(bucket) < PROBE_GROUPS:
                bucket.append(group)
        self.ops: list[Op] = []
        self.acked: set[str] = set()
        self.received: Counter[str] = Counter()
        self.sending = True
        self.consuming = True
        self.inflight: set[asyncio.Task[None]] = set()
        self.errors: Counter[str] = Counter()
        self.session: Any = None  # the aiohttp session, while run() runs

    async def run(self, body: Callable[[Probe], Any]) -> Any:
        import ssl

        import aiohttp

        context = ssl.create_default_context(cafile=self.ca)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=context),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as session:
            self.session = session
            tasks = [asyncio.create_task(self._sender(p)) for p in range(PARTITIONS)]
            tasks += [asyncio.create_task(self._consumer(w)) for w in self.workers[:2]]
            try:
                return await body(self)
            finally:
                self.sending = self.consuming = False
                for task in [*tasks, *self.inflight]:
                    task.cancel()
                await asyncio.gather(*tasks, *self.inflight, return_exceptions=True)

    async def _sender(self, partition: int) -> None:
        n = 0
        next_at = time.monotonic()
        while self.sending:
            group = self.groups[partition][n % PROBE_GROUPS]
            task = asyncio.create_task(self._send(partition, group, f"p{partition}-{n}"))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)
            n += 1
            next_at += PROBE_INTERVAL
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _send(self, partition: int, group: str, ident: str) -> None:
        import orjson

        started = time.monotonic()
        ok = False
        try:
            async with self.session.post(
                f"{self.url}/queue/1/{PROBE_QUEUE}/send?group={group}",
                data=orjson.dumps({"id": ident}),
                headers={"Content-Type": "application/json", "X-BV-API-Key": self.producer},
            ) as response:
                await response.read()
                ok = response.status == 200
                if not ok:
                    self.errors[f"send {response.status}"] += 1
        except Exception as exc:  # connection reset, timeouts: not acknowledged, counted
            self.errors[f"send {type(exc).__name__}"] += 1
        finished = time.monotonic()
        if ok:
            self.acked.add(ident)
        self.ops.append(Op(partition, started, finished, ok))

    async def _consumer(self, key: str) -> None:
        import orjson

        poll = f"{self.url}/queue/1/{PROBE_QUEUE}/poll?ttl={PROBE_TTL}&limit=10"
        ack = f"{self.url}/queue/1/{PROBE_QUEUE}/ack"
        while self.consuming:
            try:
                async with self.session.get(poll, headers={"X-BV-API-Key": key}) as response:
                    raw = await response.read()
                if response.status != 200:
                    self.errors[f"poll {response.status}"] += 1
                    await asyncio.sleep(0.1)
                    continue
                messages = orjson.loads(raw)
                if not messages:
                    await asyncio.sleep(0.05)
                    continue
                by_token: dict[int, list[str]] = {}
                for m in messages:
                    self.received[str(m["payload"]["id"])] += 1
                    by_token.setdefault(m["token"], []).append(m["id"])
                for token, ids in by_token.items():
                    headers = {"Content-Type": "application/json", "X-BV-API-Key": key,
                               "X-Strictq-Lease": str(token)}  # fmt: skip
                    async with self.session.post(ack, data=orjson.dumps(ids), headers=headers) as answer:
                        await answer.read()
                        if answer.status != 200:
                            self.errors[f"ack {answer.status}"] += 1
            except Exception as exc:  # the owner died under a poll or an ack: the claim comes back
                self.errors[f"poll/ack {type(exc).__name__}"] += 1
                await asyncio.sleep(0.1)

    def first_ok_after(self, partition: int, t0: float) -> Op | None:
        done = [op for op in self.ops if op.partition == partition and op.ok and op.started >= t0]
        return min(done, key=lambda op: op.finished) if done else None

    def longest(self, partition: int, t0: float, t1: float) -> float:
        """The longest send to `partition` started in [t0, t1] (the client's view of a stall)."""
        spans = [
            op.finished - op.started
            for op in self.ops
            if op.partition == partition and t0 <= op.started <= t1
        ]
        return max(spans, default=float("nan"))

    async def drain(self, within: float) -> float:
        """Stop sending, let in-flight sends end, consume until every acknowledged send came back."""
        self.sending = False
        started = time.monotonic()
        await until(lambda: not self.inflight, within, 0.1)
        await until(lambda: self.acked <= set(self.received), within - (time.monotonic() - started), 0.1)
        return time.monotonic() - started


@dataclass(frozen=True, slots=True)
class OwnerKill:
    """One SIGKILL of a partition's owner: when (monotonic), and the probe's first acknowledged send to the
    partition that started after it (None: none within a minute)."""

    partition: int
    owner: str
    pid: int
    killed_at: float
    first_ok: Any

    @property
    def took(self) -> float:
        return self.first_ok.finished - self.killed_at if self.first_ok else float("nan")


async def kill_owner(cluster: ClusterServer, nodes: Nodes, probe: Probe, partition: int) -> OwnerKill:
    """SIGKILL the owner of `partition` (its pid from `cluster status`); wait for the probe's next send."""
    data = await asyncio.to_thread(cluster.status)
    owner = data["partitions"][partition]["owner"]
    pid = next(n["pid"] for n in data["nodes"] if n["node"] == owner)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    nodes.killed(owner)
    op = await until(functools.partial(probe.first_ok_after, partition, t0), 60.0)
    return OwnerKill(partition, owner, pid, t0, op)


async def until(check: Callable[[], Any], within: float, pause: float = 0.01) -> Any:
    """`check()`'s first true value, polled every `pause` for `within` seconds (None if none came)."""
    deadline = time.monotonic() + within
    for _ in range(1 + int(within / pause)):
        value = check()
        if value or time.monotonic() >= deadline:
            return value or None
        await asyncio.sleep(pause)
    return None


def failover_and_moves(
    st: Settings, progress: Progress, cluster: ClusterServer, nodes: Nodes, kills: int, moves: int
) -> dict[str, Any]:
    creds = cluster.credentials()
    producer = next(v["secret"] for v in creds.values() if v["role"] == "producer")
    workers = [v["secret"] for k, v in sorted(creds.items()) if v["role"] == "worker"]
    probe = Probe(cluster.url, cluster.ca, producer, workers)
    names = ["n1", "n2", "n3"]

    async def body(probe: Probe) -> dict[str, Any]:
        await asyncio.sleep(2.0)  # the queue exists (first send) and the consumers run
        failovers: list[dict[str, Any]] = []
        for k in range(kills):
            kill = await kill_owner(cluster, nodes, probe, k % PARTITIONS)
            partition, owner, pid, took = kill.partition, kill.owner, kill.pid, kill.took
            after = await asyncio.to_thread(cluster.status)
            new_owner = after["partitions"][partition]["owner"]
            progress(
                f"    kill {k + 1}/{kills}: SIGKILL {owner} (pid {pid}, owner of p{partition}) -> first"
                f" acknowledged send to p{partition} after {took:.2f}s (now on {new_owner})"
            )
            failovers.append(
                {"partition": partition, "killed": owner, "new_owner": new_owner, "seconds": took}
            )
            restarted = time.monotonic()
            await asyncio.to_thread(nodes.start, owner)
            ok, _ = await asyncio.to_thread(wait_settled, cluster, names)
            progress(
                f"      {owner} restarted; {'settled' if ok else 'NOT settled'} after"
                f" {time.monotonic() - restarted:.1f}s"
            )
        planned: list[dict[str, Any]] = []
        for m in range(moves):
            data = await asyncio.to_thread(cluster.status)
            owned = Counter(p["owner"] for p in data["partitions"])
            source = max(names, key=lambda n: owned.get(n, 0))
            target = min((n for n in names if n != source), key=lambda n: owned.get(n, 0))
            partition = next(p["partition"] for p in data["partitions"] if p["owner"] == source)
            t0 = time.monotonic()
            done = await asyncio.to_thread(cluster.cli, "move", str(partition), target, "--wait", "60")
            t1 = time.monotonic()
            found = MOVED.search(done.stdout)
            if done.returncode != 0 or found is None:
                raise RuntimeError(f"strictq cluster move {partition} {target} failed: {done.stderr.strip()}")
            await asyncio.sleep(1.0)  # sends started during the move have ended
            stall = probe.longest(partition, t0, t1)
            progress(
                f"    move {m + 1}/{moves}: p{partition} {source} -> {target} in {float(found.group(3)):.2f}s"
                f" (CLI); longest send to p{partition} meanwhile {stall:.2f}s"
            )
            planned.append(
                {"partition": partition, "source": source, "target": target,
                 "seconds": float(found.group(3)), "command_seconds": t1 - t0, "longest_send": stall}
            )  # fmt: skip
            await asyncio.to_thread(wait_settled, cluster, names, balanced=False)
        drained = await probe.drain(DRAIN_TIMEOUT)
        lost = sorted(probe.acked - set(probe.received))
        progress(
            f"    drained in {drained:.1f}s: {len(probe.acked):,} sends acknowledged,"
            f" {len(set(probe.received)):,} distinct received, lost {len(lost)},"
            f" delivered more than once {sum(1 for c in probe.received.values() if c > 1)};"
            f" errors {dict(probe.errors)}"
        )
        return {
            "failovers": failovers,
            "failover_s": stats([f["seconds"] for f in failovers]),
            "moves": planned,
            "move_s": stats([m["seconds"] for m in planned]),
            "move_longest_send_s": stats([m["longest_send"] for m in planned]),
            "sent": len(probe.ops),
            "acknowledged": len(probe.acked),
            "received": len(set(probe.received)),
            "lost": len(lost),
            "lost_ids": lost[:20],
            "unacknowledged_received": len(set(probe.received) - probe.acked),
            "redelivered": sum(1 for c in probe.received.values() if c > 1),
            "errors": dict(probe.errors),
            "drain_seconds": drained,
        }

    progress(f"  failover: {kills} kills, then {moves} planned moves, light load on queue `{PROBE_QUEUE}`")
    result: dict[str, Any] = asyncio.run(probe.run(body))
    return result


def failover_met(fs: dict[str, Any]) -> bool:
    return bool(fs["median"] <= FAILOVER_MEDIAN_S and fs["max"] <= FAILOVER_MAX_S)


def stats(values: list[float]) -> dict[str, Any]:
    clean = [v for v in values if v == v]
    if not clean:
        return {"n": 0}
    return {
        "n": len(clean),
        "median": statistics.median(clean),
        "max": max(clean),
        "min": min(clean),
        "values": [round(v, 3) for v in values],
    }


# ----------------------------------------------------------------------------------------- entry
def run_cluster_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    kills = 3 if st.quick else 10
    moves = 2 if st.quick else 4
    progress(
        f"cluster: the gw-emodb load through `strictq cluster up` (EmoDB face, batch 10, 100 groups,"
        f" {PARTITIONS} partitions) with 1, 2, 3 queue servers at R1 and R3, beside the single-process"
        f" gateway; {st.warmup:g}s warm-up + {st.duration:g}s x {st.repeat}; then {kills} owner kills and"
        f" {moves} planned moves"
    )
    started = time.perf_counter()
    single = single_gateway(st, progress)
    rate = single["ack_rate"]
    r1, _ = throughput(st, progress, 1, rate, None)
    r3, failover = throughput(
        st, progress, 3, rate, lambda c, n: failover_and_moves(st, progress, c, n, kills, moves)
    )
    from .run import code_version  # at run time: bench.run imports the scenarios, which import this

    machine = machine_facts()
    machine["code"] = code_version()
    command = " ".join(["python -m bench.run", *(shlex.quote(a) for a in sys.argv[1:])])
    return {
        "face": FACE,
        "partitions": PARTITIONS,
        "single": single,
        "loads": [*r1, *r3],
        "failover": failover,
        "kills": kills,
        "quick": st.quick,
        "seconds": time.perf_counter() - started,
        "machine": machine,
        "command": command,
        "settings": {
            "warmup": st.warmup,
            "duration": st.duration,
            "repeat": st.repeat,
            "procs": st.procs,
            "producers": st.producers,
            "consumers": st.consumers,
            "cap": st.cap,
        },
    }


# ---------------------------------------------------------------------------------------- report
def _n(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    return f"{value:,.{digits}f}"


def _s(block: dict[str, Any], key: str) -> str:
    return f"{block[key]:.2f} s" if block.get("n") else "—"


def cluster_section(results: dict[str, Any], add: Callable[[str], None]) -> None:
    """The report's cluster section (bench/report.py calls it; nothing when the scenario did not run).
    It carries its own machine, code and command line: `--splice` may put it beside older sections."""
    r = results.get("cluster")
    if not r:
        return
    m, s, single = r["machine"], r["settings"], r["single"]
    loads, fo = r["loads"], r["failover"]
    add("## Cluster: partitions on several queue servers (`strictq cluster up`)\n")
    add(
        measured(r)
        + f"; {s['warmup']:g} s warm-up + {s['duration']:g} s measured per load run, {s['repeat']} run(s)"
        f" per figure (median kept), {s['procs']} generator processes x ({s['producers']} producers +"
        f" {s['consumers']} consumers), at most {s['cap']:,} unacked per process. The scenario took"
        f" {r['seconds']:.0f} s.\n"
    )
    add(
        f"The gw-emodb load (the **EmoDB face**, `_sendbatch` of 10 in one random group out of 100, poll 10,"
        f" ack; HTTPS) through the gateway of `strictq cluster up --partitions {r['partitions']}`"
        " `--no-proxy`, with 1, 2 and 3 queue servers, at R1 (`--replicas 1`, one nats-server) and R3"
        " (three nats-servers), beside the single-process gateway (`strictq serve`, queue core in-process,"
        " as in gw-emodb) under the same load in the same run. Each cluster starts with one queue server;"
        " the second and third join by hand (`strictq queue-server --cluster ...`) and the master's"
        " rebalancing gives each its partition before the next figure. Every queue server applies every"
        " partition: the ones it owns (answering, appending to JetStream) and the others as a standby"
        " (following the stream into its own store). CPU is read from /proc per process over the measured"
        " window; *other CPU* is the machine's busy time outside these processes and the generators.\n"
    )
    r3 = next((f for f in loads if f["replicas"] == 3 and f["nodes"] == 3), None)
    fs = fo["failover_s"]
    rows = []
    if r3:
        rows.append(
            (
                "R3, 3 queue servers / single-process gateway, end-to-end (EmoDB face)",
                f"{r3['ratio']:.2f}x ({_n(r3['ack_rate'])} / {_n(single['ack_rate'])} msg/s)",
                f"≥ {R3_TARGET:g}x",
                "**met**" if r3["ratio"] >= R3_TARGET else "**missed**",
            )
        )
    if fs.get("n"):
        rows.append(
            (
                f"Failover: SIGKILL of a partition's owner → first acknowledged send to it ({fs['n']} kills)",
                f"median {fs['median']:.2f} s, max {fs['max']:.2f} s",
                f"median ≤ {FAILOVER_MEDIAN_S:g} s, max ≤ {FAILOVER_MAX_S:g} s",
                "**met**" if failover_met(fs) else "**missed**",
            )
        )
    rows.append(
        (
            "Acknowledged sends lost across the kills and moves",
            f"{fo['lost']} of {_n(fo['acknowledged'])}",
            "0",
            "**met**" if fo["lost"] == 0 else "**missed**",
        )
    )
    add("| target | measured | threshold | status |\n|---|---|---|---|")
    for row in rows:
        add("| " + " | ".join(row) + " |")
    add("")
    add("### Throughput through the gateway\n")
    add(
        "| configuration | end-to-end msg/s (median) | every run | / single-process | gateway cores"
        " | queue servers cores | nats-servers cores | servers' CPU µs per message | generator cores"
        " | other CPU, cores | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for label, f in [("single-process gateway (`strictq serve`)", single)] + [
        (f"cluster R{f['replicas']}, {f['nodes']} queue server{'s' if f['nodes'] > 1 else ''}", f)
        for f in loads
    ]:
        roles = f["roles"]
        runs = "<br>".join(_n(run[0]) for run in f.get("runs") or []) if len(f.get("runs") or []) > 1 else "—"
        ours = sum(roles.values()) + f["generator_cores"]
        other = max(0.0, f["machine_busy_window"] * int(m["nproc"]) - ours)
        ratio = f"{f['ack_rate'] / single['ack_rate']:.2f}x" if single["ack_rate"] else "—"
        add(
            f"| {label} | **{_n(f['ack_rate'])}** | {runs} | {ratio} | {roles['gateway']:.2f} |"
            f" {roles['queue servers']:.2f} | {roles['nats-servers']:.2f} |"
            f" {_n(f['servers_us_per_message'])} |"
            f" {f['generator_cores']:.2f} | {other:.2f} | {f['errors']} |"
        )
    add("")
    if r3:
        add(f"### Where the time goes: R3, 3 queue servers ({_n(r3['ack_rate'])} msg/s)\n")
        add("| process | CPU, cores | its main thread (event loop), cores | CPU µs per message |")
        add("|---|---:|---:|---:|")
        acked = r3["acked"] or 1
        for name, c in sorted(r3["cpu"].items()):
            us = 1e6 * c["total"] * r3["duration"] / acked
            add(f"| {name} | {c['total']:.2f} | {c['main']:.2f} | {us:.0f} |")
        gw_single = 1e6 * single["roles"]["gateway"] * single["duration"] / (single["acked"] or 1)
        add(
            f"| *single-process gateway, for comparison* | {single['roles']['gateway']:.2f} | |"
            f" {gw_single:.0f} |\n"
        )
        prof = r3.get("profile") or {}
        if prof.get("shares"):
            names = sorted(prof["shares"], key=lambda n: (n != "gateway", n))
            categories: list[str] = []
            for share in prof["shares"].values():
                categories += [k for k in share if k not in categories]
            add(
                f"py-spy on the gateway and each queue server during one more run (not counted:"
                f" {_n(prof['ack_rate'])} msg/s while sampled), every thread; idle, lock, GIL and fsync waits"
                " left out: the share of each process's remaining samples by the innermost package on the"
                " stack. Raw stacks:"
                " `bench/out/cluster-profile-*.pyspy.txt`.\n"
            )
            add("| where | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
            for category in categories:
                cells = [f"{100 * prof['shares'][n].get(category, 0.0):.0f}%" for n in names]
                add(f"| {category} | " + " | ".join(cells) + " |")
            add("")
        if r3["ratio"] < R3_TARGET:
            add("Where the extra CPU per acknowledged message goes (from the throughput table):\n")
            for line in gap_lines(single, loads):
                add(f"- {line}")
            add("")
            add(CLUSTER_GAP_NOTE)
    add("### Failover and planned moves (R3, 3 queue servers)\n")
    add(
        f"A light open-loop load on queue `{PROBE_QUEUE}` (a send every {1000 * PROBE_INTERVAL:.0f} ms to"
        f" each partition, {PROBE_GROUPS} groups per partition, two consumers polling and acking, claim ttl"
        f" {PROBE_TTL} s) runs throughout. {r['kills']} times: SIGKILL the owner of partition k mod"
        f" {r['partitions']} (pid from `strictq cluster status --json`); the failover time is from the kill"
        " to the first acknowledged send to that partition that *started* after the kill; then the killed"
        " queue server is restarted by hand on its store and the cluster left to rebalance. Then"
        " `strictq cluster move P NODE` a few times (from the node owning most to the one owning least). At"
        " the end the consumers drain: an acknowledged send that never comes back is lost.\n"
    )
    ms, ml = fo["move_s"], fo["move_longest_send_s"]
    add("| figure | median | max | n | target | status |\n|---|---:|---:|---:|---|---|")
    if fs.get("n"):
        status = "met" if failover_met(fs) else "missed"
        add(
            f"| SIGKILL of the owner → first acknowledged send to its partition | {_s(fs, 'median')} |"
            f" {_s(fs, 'max')} | {fs['n']} | median ≤ {FAILOVER_MEDIAN_S:g} s, max ≤ {FAILOVER_MAX_S:g} s"
            f" | {status} |"
        )
    if ms.get("n"):
        add(
            f"| planned move (`strictq cluster move`: request → the target serves it) | {_s(ms, 'median')} |"
            f" {_s(ms, 'max')} | {ms['n']} | | reported |"
        )
        add(
            f"| longest send to the moving partition during a move (client's view) | {_s(ml, 'median')} |"
            f" {_s(ml, 'max')} | {ml['n']} | | reported |"
        )
    add(
        f"\nEvery failover, in seconds: {', '.join(f'{v:.2f}' for v in fs.get('values', []))}. Messages:"
        f" {_n(fo['sent'])} sends, {_n(fo['acknowledged'])} acknowledged, {_n(fo['received'])} distinct"
        f" received, **{fo['lost']} lost**; {fo['unacknowledged_received']} delivered although their send"
        f" was not acknowledged (a 503 or a reset after the owner had appended), {fo['redelivered']}"
        " delivered more than once (a claim whose ack did not reach a dead owner comes back after its"
        " ttl). Errors seen by the probe: "
        + (", ".join(f"{k}: {v}" for k, v in fo["errors"].items()) or "none")
        + ".\n"
    )


def _us(f: dict[str, Any], role: str) -> float:
    """CPU µs per acknowledged message of one role (gateway, queue servers, nats-servers) in a figure."""
    return 1e6 * f["roles"][role] * f["duration"] / f["acked"] if f["acked"] else float("nan")


def gap_lines(single: dict[str, Any], loads: list[dict[str, Any]]) -> list[str]:
    """Plain readings of the throughput table: what each part of the cluster costs per message."""
    by = {(f["replicas"], f["nodes"]): f for f in loads}
    lines: list[str] = []
    one, r1x3, r3x3 = by.get((1, 1)), by.get((1, 3)), by.get((3, 3))
    alone = _us(single, "gateway")
    if one:
        lines.append(
            f"The gateway: {_us(one, 'gateway'):.0f} µs in the cluster (R1, 1 queue server) against"
            f" {alone:.0f} µs for the single-process gateway *with the queue core inside it*: every request"
            " of the face becomes one or more internal HTTP requests (a poll passes over the partitions one"
            " after another until it has 10 messages), each an aiohttp client call with its JSON."
        )
        lines.append(
            f"The owner: {_us(one, 'queue servers'):.0f} µs in the one queue server (the internal API's"
            " HTTP server side, the core, SQLite, and the JetStream append of every commit through nats-py)."
        )
    if one and r1x3:
        standby = (_us(r1x3, "queue servers") - _us(one, "queue servers")) / 2
        lines.append(
            f"Each standby: about {standby:.0f} µs more per message and per extra queue server (R1: 1 → 3"
            f" queue servers, {_us(one, 'queue servers'):.0f} → {_us(r1x3, 'queue servers'):.0f} µs): every"
            " queue server receives every partition's frames through nats-py (and its event loop) and"
            " applies them to its own SQLite store, so on one machine that is done three times."
        )
    if r1x3 and r3x3:
        lines.append(
            f"JetStream: {_us(r1x3, 'nats-servers'):.0f} µs at R1 and {_us(r3x3, 'nats-servers'):.0f} µs at"
            " R3 (three nats-servers, each frame stored by the leader and two followers, then delivered to"
            " two standbys)."
        )
    if r3x3:
        total = r3x3["servers_us_per_message"]
        lines.append(
            f"In all {total:.0f} µs per message at R3 with 3 queue servers against {alone:.0f} µs: the"
            " gateway, three queue servers and three nats-servers share the same two cores, so the rate"
            " falls with the CPU per message, and adding queue servers on one machine adds standbys, not"
            " capacity."
        )
        labelled = [("single", single)] + [(f"R{f['replicas']} x {f['nodes']}", f) for f in loads]
        busy = [
            f"{label}: {other:.2f}"
            for label, f in labelled
            if (other := f["machine_busy_window"] * (os.cpu_count() or 1) - sum(f["roles"].values())
                - f["generator_cores"]) >= 0.3
        ]  # fmt: skip
        if busy:
            lines.append(
                "Unrelated work shared the machine during some figures (other CPU, cores: "
                + ", ".join(busy)
                + "): those rates are lower than on an idle machine; the CPU per message is the steadier"
                " figure."
            )
        cores = os.cpu_count() or 1
        ceiling = cores * 1e6 / total if total else float("nan")
        lines.append(
            f"CPU ceiling on this machine: {cores} cores / {total:.0f} µs = {ceiling:,.0f} msg/s at most even"
            f" with no other load, i.e. {ceiling / single['ack_rate']:.2f}x the single-process figure: the"
            f" {R3_TARGET:g}x target cannot be met here at this CPU per message, whatever the scheduling."
        )
    return lines


CLUSTER_GAP_NOTE = (
    "What would close the gap, by expected gain. (1) Machines of their own: a real deployment runs each"
    " queue server and nats-server on its own machine, where each carries about a third of the CPU per"
    " message above (one owner's work, two standbys' applies, one JetStream replica) and the owners of"
    " different partitions work in parallel; on one 2-core machine the cluster does all of that on the"
    " cores the single process has to itself. (2) The gateway-to-node hop, the largest part in the"
    " profile (aiohttp on both sides and the event loop's task switching around it): a poll that asks"
    " every partition at once in one request instead of one after another, a node answering for all of"
    " its partitions in one request, one persistent pipelined connection per node with a binary body"
    " instead of JSON, the ack piggy-backed on the next poll. (3) nats-py, the next part on the queue"
    " servers: it parses the NATS protocol in Python, once per frame published by the owner and once per"
    " frame delivered to each standby. Issue 28 made the frames bigger (an owner under load lingers 5 ms"
    " before its next append: several group commits per frame), the standbys gather 50 ms of frames into"
    " one SQLite transaction (taken by callback, not a task per frame), and no queue server fsyncs its"
    " store per commit (the stream is the durable record): `python -m bench.cluster_cpu` measures these"
    " alone. What is left here: fewer frames still (pipelined appends), and (4) standbys that apply"
    " nothing until promoted, which the promotion time at 100k queued messages argues against (see"
    " docs/benchmarks.md, the data path's CPU per message).\n"
)
