"""`strictq cluster up`: a whole cluster on one machine, as child processes of one supervisor.

JetStream servers first (cluster.nats_servers, in `<data-dir>/nats`), then the queue servers
(`strictq queue-server --cluster ... --node n<K>`, in `<data-dir>/nodes/n<K>`; n1 alone first, so one
process creates the cluster's layout and streams, then the others together), then, once every partition is
served and balanced, the gateway (`strictq serve --cluster ...`, in `<data-dir>/gateway`, with its proxy
child). Its stdout carries the start-up contract: the gateway's own lines relayed as they come, one
`strictq: node <name> pid <pid> <url>` line per queue server, one `strictq: nats <url>` per JetStream
server, `strictq: internal secret <path>` (DIR/internal.secret, written once and given to every node and
edge: queue_core.internal_auth), and `strictq: cluster ready` last.

Why children and not one process: a queue server is killed on purpose to see its partitions fail over, and
a real deployment runs each piece alone; here they are the same commands, supervised. A child that dies is
reported and not restarted (the cluster moves its partitions). The children run in their own sessions, so
a Ctrl-C in the terminal reaches this process only, which stops them in order: gateway, queue servers,
JetStream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from access.keys import write_development_keys
from cluster.connect import NatsSettings, NatsUnavailable, connect, credentials_path, gateway_credentials_path
from cluster.layout import read_layout
from cluster.nats_servers import NatsCluster, NatsClusterError
from queue_core.internal_auth import FILE_NAME as SECRET_FILE_NAME
from queue_core.internal_auth import InternalSecret
from wirelog.files import StartupError, file_faults, open_private, private_dir

from .cluster_view import ClusterView, read_view
from .startup_guard import Port, check_ports, data_dir_lock

NODE_START_TIMEOUT = 60.0  # a queue server: imports, NATS, the layout, its partitions' followers
GATEWAY_START_TIMEOUT = 90.0  # the gateway and its proxy child (mitmproxy imports for seconds)
SETTLE_TIMEOUT = 60.0  # every partition served and balanced (the master's rebalancing moves one at a time)
STOP_TIMEOUT = 15.0  # per stage: the gateway, then the queue servers, then JetStream
TAIL_LINES = 12  # of a child's log, shown when it fails to start
POLL = 0.1

LISTENING = "strictq: listening on "
NODE_LINE = "strictq: node "
CLIENT_ENV = "strictq: client env "
TRY_LINE = "strictq: try "
TRY_WITHIN = 2.0  # serve prints its `try` line right after `client env`


@dataclass(frozen=True, slots=True)
class UpOptions:
    data_dir: Path
    nodes: int = 3
    replicas: int = 3
    partitions: int = 3
    host: str = "127.0.0.1"
    port: int = 8443
    proxy: bool = True
    proxy_port: int | None = None
    nats_servers: int = 3
    regions: tuple[str, ...] = ()  # --regions: node (and JetStream server) i runs in regions[i % len]
    health: tuple[str, ...] = ()  # failure-management flags for every queue server (--fence-after 3 ...)
    node_timeout: float = NODE_START_TIMEOUT
    gateway_timeout: float = GATEWAY_START_TIMEOUT
    settle_timeout: float = SETTLE_TIMEOUT


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while starting: stop what runs, exit 0."""


class StartFailed(Exception):
    """A piece did not start; the message (possibly several lines: a child's log tail) is for the user."""


def say(line: str) -> None:
    print(line, flush=True)


def warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Child:
    """One strictq child: stdout read by a thread (start-up lines), stderr appended to its log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, label: str) -> None:
        self.name = name
        self.label = label  # "queue server n1", "gateway": how messages name it
        self.log_path = log_path
        with file_faults(log_path):
            log = open_private(log_path)
        self.log_mark = log.tell()
        with log:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor, which stops us in order
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.reported = False
        threading.Thread(target=self._drain, name=f"strictq-{name}-stdout", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put(None)

    def read_until(
        self, prefixes: Sequence[str], timeout: float, stop: threading.Event, relay: Callable[[str], None]
    ) -> dict[str, str]:
        """Read stdout lines (each given to `relay`) until one starting with every prefix has been seen;
        StartFailed if the child exits or stays silent past `timeout`, Stopped on a signal."""
        missing = list(prefixes)
        seen: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while missing:
            if stop.is_set():
                raise Stopped
            try:
                line = self.lines.get(timeout=POLL)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise StartFailed(self.failure(f"exited with {self.proc.returncode}")) from None
                if time.monotonic() > deadline:
                    raise StartFailed(self.failure(f"did not start within {timeout:g}s")) from None
                continue
            if line is None:  # stdout closed: it exited (or is about to)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(2.0)
                raise StartFailed(self.failure(f"exited with {self.proc.returncode}"))
            relay(line)
            for prefix in list(missing):
                if line.startswith(prefix):
                    seen[prefix] = line
                    missing.remove(prefix)
        return seen

    def pending_lines(self) -> list[str]:
        found: list[str] = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return found
            if line is not None:
                found.append(line)

    def failure(self, what: str) -> str:
        """`<label> (pid N) <what>` and the last lines it wrote to its log since it started."""
        head = f"strictq: {self.label} (pid {self.pid}) {what}"
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_mark)
                text = f.read()[-64_000:].decode(errors="replace")
        except OSError:
            text = ""
        tail = [line for line in text.splitlines() if line.strip()][-TAIL_LINES:]
        if not tail:
            return f"{head}; its log {self.log_path} is empty"
        shown = "\n".join(f"  {line}" for line in tail)
        return f"{head}; the last lines of {self.log_path}:\n{shown}"

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)


def stop_children(children: Sequence[Child], timeout: float) -> None:
    """SIGTERM each (SIGCONT first: a stopped one cannot act on it), wait up to `timeout` for all, then
    SIGKILL whatever still runs."""
    for child in children:
        child.signal(signal.SIGCONT)
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            warn(f"strictq: {child.label} (pid {child.pid}) did not stop within {timeout:g}s: killing it")
            child.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(STOP_TIMEOUT)


class ClusterUp:
    def __init__(self, options: UpOptions) -> None:
        self.options = options
        self.data_dir = options.data_dir
        self.logs = options.data_dir / "logs"
        self.stop = threading.Event()
        self.nats: NatsCluster | None = None
        self.nodes: list[Child] = []
        self.gateway: Child | None = None
        self._nats_pids: list[int | None] = []

    # ---------------------------------------------------------------------------------- commands
    def strictq(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "strictq", *args]

    @property
    def gateway_keys(self) -> Path:
        """The gateway's key file (`strictq serve`'s default in its data dir), which the nodes share."""
        return self.data_dir / "gateway" / "keys.toml"

    @property
    def secret_path(self) -> Path:
        """The cluster's internal secret (queue_core.internal_auth), written once: every node and edge
        it starts gets this one file."""
        return self.data_dir / SECRET_FILE_NAME

    def nats_args(self, role: str = "server") -> list[str]:
        """`--cluster URLS --nats-credentials FILE`: the queue servers' login, or the edges' restricted
        one for `role` "gateway" (cluster.nats_roles) where the data dir has it."""
        assert self.nats is not None
        credentials = credentials_path(self.data_dir)
        if role == "gateway" and gateway_credentials_path(self.data_dir).exists():
            credentials = gateway_credentials_path(self.data_dir)
        return ["--cluster", ",".join(self.nats.client_urls), "--nats-credentials", str(credentials)]

    def node_argv(self, name: str) -> list[str]:
        o = self.options
        return self.strictq(
            "queue-server",
            *self.nats_args(),
            "--node",
            name,
            "--data-dir",
            str(self.data_dir / "nodes" / name),
            "--host",
            o.host,
            "--port",
            "0",
            "--cluster-partitions",
            str(o.partitions),
            "--replicas",
            str(o.replicas),
            "--keys",  # the gateway's key file: one operator key scrapes the edge and every node
            str(self.gateway_keys),
            *self.where(int(name.removeprefix("n")) - 1),
            *o.health,
            "--internal-secret",  # the one file of every node and edge
            str(self.secret_path),
        )

    def where(self, i: int) -> list[str]:
        """`--region R --zone R-1` for the i-th node (0-based) with --regions, else nothing."""
        region = self.region(i)
        return [] if region is None else ["--region", region, "--zone", f"{region}-1"]

    def region(self, i: int) -> str | None:
        regions = self.options.regions
        return regions[i % len(regions)] if regions else None

    def gateway_argv(self) -> list[str]:
        o = self.options
        proxy = (
            ["--no-proxy"]
            if not o.proxy
            else []
            if o.proxy_port is None
            else ["--proxy-port", str(o.proxy_port)]
        )
        return self.strictq(
            "serve",
            *self.nats_args("gateway"),
            "--data-dir",
            str(self.data_dir / "gateway"),
            "--host",
            o.host,
            "--port",
            str(o.port),
            *proxy,
            "--internal-secret",
            str(self.secret_path),
        )

    def gateway_ports(self) -> list[Port]:
        """The ports the gateway and its proxy will listen on, as `strictq serve` counts them."""
        from .serve import ServeOptions, listening_ports

        o = self.options
        gateway = self.data_dir / "gateway"
        return listening_ports(ServeOptions(o.host, o.port, gateway, proxy=o.proxy, proxy_port=o.proxy_port))

    # -------------------------------------------------------------------------------------- run
    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            with data_dir_lock(self.data_dir, "cluster up"):
                try:
                    self._start()
                except Stopped:
                    warn("strictq: stopping (a signal arrived while starting)")
                    return 0
                except StartFailed as exc:
                    warn(str(exc))
                    return 1
                except (NatsClusterError, NatsUnavailable) as exc:
                    warn(f"strictq: {exc}")
                    return 1
                else:
                    self._supervise()
                    warn("strictq: stopping the cluster")
                    return 0
                finally:
                    self._shutdown()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()

    def _start(self) -> None:
        o = self.options
        check_ports(o.host, self.gateway_ports())  # before anything starts: one line naming the flag
        with file_faults(self.logs):
            private_dir(self.data_dir)
            private_dir(self.logs)
        # With --regions, JetStream server i runs where node i does (its tags: cluster.nats_servers).
        regions = [o.regions[i % len(o.regions)] for i in range(o.nats_servers)] if o.regions else None
        zones = [f"{region}-1" for region in regions] if regions is not None else None
        self.nats = NatsCluster(self.data_dir, o.nats_servers, o.host, zones=zones, regions=regions)
        self.nats.start()
        self._nats_pids = [self.nats.pid(i) for i in range(self.nats.count)]
        if self.stop.is_set():
            raise Stopped
        if not self.gateway_keys.exists():  # written before the nodes start: they read it (--keys)
            with file_faults(self.gateway_keys.parent):
                write_development_keys(self.gateway_keys)
        try:
            InternalSecret.ensure(self.secret_path)  # 0600; one open to other users is refused
        except StartupError as exc:
            raise StartFailed(f"strictq: {exc}") from None
        node_lines: dict[str, str] = {}
        names = [f"n{k + 1}" for k in range(o.nodes)]
        # n1 alone first: it creates the cluster's layout, streams and buckets; then the others together.
        for batch in (names[:1], names[1:]):
            started = [self._spawn_node(name) for name in batch]
            for child in started:
                seen = child.read_until([NODE_LINE], o.node_timeout, self.stop, lambda line: None)
                node_lines[child.name] = seen[NODE_LINE]
        self._wait_settled()
        self.gateway = Child("gateway", self.gateway_argv(), self.logs / "gateway.log", "gateway")
        wanted = [LISTENING, CLIENT_ENV]
        self.gateway.read_until(wanted, o.gateway_timeout, self.stop, say)
        self._relay_try_line()
        for name in names:
            say(node_lines[name])
        for url in self.nats.client_urls:
            say(f"strictq: nats {url}")
        say(f"strictq: internal secret {self.secret_path.resolve()}")
        say("strictq: cluster ready")

    def _spawn_node(self, name: str) -> Child:
        child = Child(name, self.node_argv(name), self.logs / f"{name}.log", f"node {name}")
        self.nodes.append(child)
        return child

    def _relay_try_line(self) -> None:
        """serve's last start-up line (`strictq: try ...`) follows `client env` at once: relay it before
        our own lines, so `cluster ready` stays last."""
        assert self.gateway is not None
        with contextlib.suppress(StartFailed):
            self.gateway.read_until([TRY_LINE], TRY_WITHIN, self.stop, say)

    def _wait_settled(self) -> None:
        """Until every partition is served and the master has nothing left to rebalance (bounded: past
        SETTLE_TIMEOUT, one warning line and on; the cluster may still converge)."""
        assert self.nats is not None
        settings = NatsSettings(tuple(self.nats.client_urls), *self.nats.credentials)
        view = asyncio.run(self._settle(settings))
        if view is None or view.settled():
            return
        unserved = [f"p{p.partition}" for p in view.partitions if not p.serving]
        detail = f"partitions not served yet: {', '.join(unserved)}" if unserved else "still rebalancing"
        warn(
            f"strictq: the cluster did not settle within {self.options.settle_timeout:g}s ({detail}); "
            "going on"
        )

    async def _settle(self, settings: NatsSettings) -> ClusterView | None:
        nc = await connect(settings.urls, settings.user, settings.password, name="strictq-cluster-up")
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + self.options.settle_timeout
            view: ClusterView | None = None
            while time.monotonic() < deadline:
                self._check_starting()
                with contextlib.suppress(Exception):  # JetStream electing a leader: look again
                    layout = await read_layout(js)
                    if layout is not None:
                        view = await read_view(js, layout, settings.urls)
                        if view.settled():
                            return view
                await asyncio.sleep(0.25)
            return view
        finally:
            await nc.close()

    def _check_starting(self) -> None:
        if self.stop.is_set():
            raise Stopped
        for child in self.nodes:
            if child.proc.poll() is not None:
                raise StartFailed(child.failure(f"exited with {child.proc.returncode}"))

    # ------------------------------------------------------------------------------- supervising
    def _supervise(self) -> None:
        """Until SIGTERM/SIGINT: report each child that dies, once (not restarted: the crash tests kill
        owners on purpose); relay what the gateway prints later."""
        while not self.stop.wait(0.2):
            for child in [*self.nodes, *([self.gateway] if self.gateway else [])]:
                for line in child.pending_lines():
                    if child is self.gateway:
                        say(line)
                if not child.reported and child.proc.poll() is not None:
                    child.reported = True
                    warn(f"strictq: {child.label} (pid {child.pid}) exited with {child.proc.returncode}")
            if self.nats is not None:
                for i, pid in enumerate(self._nats_pids):
                    if pid is not None and self.nats.pid(i) is None:
                        self._nats_pids[i] = None
                        warn(
                            f"strictq: nats {self.nats.names[i]} (pid {pid}) exited; see "
                            f"{self.nats.log_path(i)}"
                        )

    def _shutdown(self) -> None:
        if self.gateway is not None:
            stop_children([self.gateway], STOP_TIMEOUT)
        stop_children(self.nodes, STOP_TIMEOUT)
        if self.nats is not None:
            self.nats.stop()


def run_up(options: UpOptions) -> int:
    """`strictq cluster up`. Faults of the data dir, its lock or the nats-server binary are raised as
    StartupErrors (one line, exit 2: strictq.cli.run_server renders them)."""
    return ClusterUp(options).run()
