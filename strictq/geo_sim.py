"""A simulated world of regions on one machine (issue 16): the tests, `strictq demo --geo` and the benchmark.

Why a module of its own: showing that ownership follows the producers needs regions that are far apart,
and this machine's kernel has no netem. A `GeoWorld` starts, as real processes on loopback:

- one JetStream server per region (cluster.nats_servers, zone `<region>-1`, region tag `<region>`);
- one queue server per region (`strictq queue-server --cluster ... --node <region> --region <region>
  --zone <region>-1`): the node is named after its region;
- one `cluster.wan.DelayRelay` per (edge region, node in another region): the simulated inter-region
  link, delaying each direction by the pair's one-way delay;
- one edge per region (`strictq serve --cluster ... --region <region> --zone <region>-1 --edge-name
  edge-<region> --reach <node>=<relay url> ... --no-proxy`): an edge reaches the node of its own region
  directly and every other node through the relay of that pair.

So a client of the `us` edge sending to a group whose partition is owned in `eu` pays the eu<->us round
trip on every call the edge makes to the owner, and stops paying it once the partition's owner is `us`.
What is simulated: the edge -> owner link only (the latency placement saves). The queue servers' links to
JetStream, JetStream's own routes and the clients' links to their edge are plain loopback. Bandwidth and
loss are not simulated. A real deployment has real regions and none of this: see docs/cluster.md.

The relays run on the event loop of the task that started the world: never block that loop (use aiohttp
or asyncio subprocesses in a test or demo, not boto3 or subprocess.run), or every simulated link stalls.

Cleanup survives a SIGKILL of the owner: every process the world starts (JetStream servers included) is
written to a pid list that a small reaper process holds; the reaper waits for its stdin pipe to close,
which happens when the owner exits however it exits, and then SIGKILLs whatever is still running from
the list (checking each pid's start time, so a reused pid is never hit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from nats.aio.client import Client

from access.keys import Credential, KeyRing, write_development_keys
from cluster.connect import connect, credentials_path
from cluster.layout import read_layout
from cluster.nats_servers import NatsCluster
from cluster.wan import DelayRelay
from queue_core.internal_auth import FILE_NAME as SECRET_FILE_NAME
from queue_core.internal_auth import InternalSecret
from queue_core.machine.groups import partition_of
from wirelog.files import open_private, private_dir

from .cluster_view import ClusterView, read_view

DEFAULT_REGIONS = ("eu", "us", "ap")
DEFAULT_DELAYS: Mapping[tuple[str, str], float] = {
    ("eu", "us"): 0.040,
    ("us", "ap"): 0.090,
    ("eu", "ap"): 0.120,
}
HOST = "127.0.0.1"  # loopback only: the relays and every process listen here
NODE_TIMEOUT = 60.0  # a queue server's start: imports, NATS, the layout, its followers
EDGE_TIMEOUT = 60.0  # an edge's start (no proxy child)
SETTLE_TIMEOUT = 60.0  # every partition served and balanced before the edges start
STOP_TIMEOUT = 10.0  # per process, then SIGKILL
CLI_TIMEOUT = 60.0
POLL = 0.1

LISTENING = "strictq: listening on "
NODE_LINE = "strictq: node "
CLIENT_ENV = "strictq: client env "

# Started with the world, stdin a pipe from it: waits for EOF (the owner exited, however), then SIGKILLs
# every process of the pid list still running with the start time recorded for it.
_REAPER = r"""
import os, signal, sys
sys.stdin.buffer.read()
try:
    lines = open(sys.argv[1]).read().split("\n")
except OSError:
    lines = []
for line in lines:
    parts = line.split()
    if len(parts) != 2:
        continue
    try:
        stat = open(f"/proc/{parts[0]}/stat").read().rsplit(")", 1)[1].split()
        if stat[19] == parts[1] and stat[0] != "Z":
            os.kill(int(parts[0]), signal.SIGKILL)
    except (OSError, IndexError, ValueError):
        pass
"""


class GeoError(RuntimeError):
    """A piece of the world did not start or a command failed; the message names its log."""


# ------------------------------------------------------------------------------------------ delays
_DELAY_RE = re.compile(r"^\s*([A-Za-z0-9_]+)-([A-Za-z0-9_]+)\s*=\s*([0-9.]+)\s*(ms|s)?\s*$")


def parse_delays(text: str) -> dict[tuple[str, str], float]:
    """`eu-us=40ms,us-ap=90ms,eu-ap=0.12s` -> {("eu", "us"): 0.04, ...}: one-way delays in seconds (a bare
    number is seconds). ValueError naming the bad item."""
    delays: dict[tuple[str, str], float] = {}
    for item in (part for part in text.split(",") if part.strip()):
        found = _DELAY_RE.match(item)
        if found is None:
            raise ValueError(
                f"bad delay {item.strip()!r}: expected REGION-REGION=<number>ms (e.g. eu-us=40ms)"
            )
        a, b, number, unit = found.groups()
        try:
            value = float(number)
        except ValueError:
            raise ValueError(f"bad delay {item.strip()!r}: {number!r} is not a number") from None
        if a == b:
            raise ValueError(f"bad delay {item.strip()!r}: a region has no delay to itself")
        delays[(a, b)] = value / 1000.0 if unit == "ms" else value
    return delays


def one_way(delays: Mapping[tuple[str, str], float], a: str, b: str) -> float:
    """The one-way delay between regions `a` and `b` (0 within a region); KeyError if not configured."""
    if a == b:
        return 0.0
    if (a, b) in delays:
        return delays[(a, b)]
    return delays[(b, a)]


# --------------------------------------------------------------------------------------- processes
@dataclass(frozen=True, slots=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


class _Reaper:
    """The SIGKILL-safe half of cleanup (see the module's docstring)."""

    def __init__(self, pid_file: Path) -> None:
        self.pid_file = pid_file
        with open_private(pid_file):
            pass
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(pid_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C must not take it before it has reaped
        )

    def add(self, pid: int) -> None:
        try:
            start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            return  # already gone
        with self.pid_file.open("a") as f:
            f.write(f"{pid} {start}\n")

    def close(self) -> None:
        """Reap what is left now (nothing, after an orderly stop) and let the reaper exit."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT)


class _Child:
    """One strictq process of the world: stdout lines read by a task, stderr in its log file."""

    def __init__(self, label: str, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.label = label
        self.proc = proc
        self.log_path = log_path
        self.lines: list[str] = []
        self._new_line = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name=f"strictq-geo-{label}-stdout")

    @classmethod
    async def start(cls, label: str, argv: Sequence[str], log_path: Path) -> _Child:
        with open_private(log_path) as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # signals come from the world only, which stops them in order
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return cls(label, proc, log_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self._new_line.set()
        self._new_line.set()

    def value(self, prefix: str) -> str | None:
        return next((line[len(prefix) :].strip() for line in self.lines if line.startswith(prefix)), None)

    async def wait_for(self, prefixes: Sequence[str], within: float) -> dict[str, str]:
        """The values of the start-up lines with these prefixes; GeoError with the log's tail if the
        process exits or stays silent past `within` seconds."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            found = {p: v for p in prefixes if (v := self.value(p)) is not None}
            if len(found) == len(prefixes):
                return found
            if self._reader.done():
                raise GeoError(self.failure(f"exited with {await self.proc.wait()}"))
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise GeoError(self.failure(f"did not start within {within:g}s"))
            self._new_line.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_line.wait(), min(remaining, 1.0))

    def failure(self, what: str) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-12:]
        except OSError:
            tail = []
        shown = "\n".join(f"  {line}" for line in tail) or "  (empty)"
        return (
            f"strictq geo: {self.label} (pid {self.pid}) {what}; the last lines of {self.log_path}:\n{shown}"
        )

    def signal(self, signum: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def stop(self, within: float = STOP_TIMEOUT) -> None:
        """SIGTERM (after SIGCONT), SIGKILL if it has not exited within `within` seconds."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


def _strictq(*args: str) -> list[str]:
    return [sys.executable, "-m", "strictq", *args]


# ------------------------------------------------------------------------------------------- world
class GeoWorld:
    """Regions, their nodes, edges and links, on loopback (see the module docstring). An async context
    manager: `async with GeoWorld(tmp) as world: world.edge_url("us") ...`.

    `delays`: one-way seconds per region pair (every pair of `regions` must be given, either order);
    `partitions`: the cluster's partitions; `traffic_window`: the edges' `--traffic-window` (seconds);
    `edge_args`: extra `strictq serve` flags for every edge."""

    def __init__(
        self,
        data_dir: Path,
        *,
        regions: Sequence[str] = DEFAULT_REGIONS,
        delays: Mapping[tuple[str, str], float] = DEFAULT_DELAYS,
        partitions: int = 3,
        traffic_window: float = 60.0,
        edge_args: Sequence[str] = (),
        node_timeout: float = NODE_TIMEOUT,
        edge_timeout: float = EDGE_TIMEOUT,
    ) -> None:
        if len(set(regions)) != len(regions) or not regions:
            raise ValueError("regions must be distinct and at least one")
        for i, a in enumerate(regions):
            for b in regions[i + 1 :]:
                try:
                    one_way(delays, a, b)
                except KeyError:
                    raise ValueError(f"no delay given between regions {a} and {b}") from None
        self.data_dir = Path(data_dir)
        self.regions = tuple(regions)
        self.delays = dict(delays)
        self.partitions = partitions
        self.traffic_window = traffic_window
        self.edge_args = tuple(edge_args)
        self.node_timeout = node_timeout
        self.edge_timeout = edge_timeout
        self.replicas = 3 if len(self.regions) >= 3 else 1
        self.logs = self.data_dir / "logs"
        self.keys_path = self.data_dir / "keys.toml"
        self.nats: NatsCluster | None = None
        self.nc: Client | None = None
        self._reaper: _Reaper | None = None
        self._nodes: dict[str, _Child] = {}  # node name (= its region) -> process
        self._node_urls: dict[str, str] = {}
        self._edges: dict[str, _Child] = {}  # region -> process
        self._relays: dict[tuple[str, str], DelayRelay] = {}  # (edge region, node) -> relay

    # ----------------------------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Everything, in order; on failure whatever started is stopped and GeoError (or the error) raised."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        private_dir(self.data_dir)
        private_dir(self.logs)
        self._reaper = _Reaper(self.data_dir / "pids")
        if not self.keys_path.exists():
            write_development_keys(self.keys_path)  # one key file for every edge: a client may change edge
        InternalSecret.ensure(self.secret_path)  # one internal secret for every node and edge
        self.nats = NatsCluster(
            self.data_dir,
            len(self.regions),
            HOST,
            zones=[f"{r}-1" for r in self.regions],
            regions=list(self.regions),
        )
        await asyncio.to_thread(self.nats.start)
        for i in range(self.nats.count):
            if (pid := self.nats.pid(i)) is not None:
                self._reaper.add(pid)
        self.nc = await connect(self.nats.client_urls, *self.nats.credentials, name="strictq-geo")
        # The first node alone creates the cluster's layout and streams, then the others together.
        for batch in (self.regions[:1], self.regions[1:]):
            await asyncio.gather(*(self._start_node(region) for region in batch))
        await self._wait_settled()
        for edge_region in self.regions:
            for node in self.regions:
                if node != edge_region:
                    relay = DelayRelay(HOST, self._port(node), one_way(self.delays, edge_region, node))
                    await relay.start()
                    self._relays[(edge_region, node)] = relay
        await asyncio.gather(*(self._start_edge(region) for region in self.regions))

    async def close(self) -> None:
        """Stop everything (edges, relays, nodes, JetStream); safe to call twice, and after a failed start."""
        await asyncio.gather(*(edge.stop() for edge in self._edges.values()), return_exceptions=True)
        for relay in self._relays.values():
            with contextlib.suppress(Exception):
                await relay.close()
        await asyncio.gather(*(node.stop() for node in self._nodes.values()), return_exceptions=True)
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = None
        if self.nats is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.nats.stop)
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        self._edges.clear()
        self._relays.clear()
        self._nodes.clear()

    async def _spawn(self, label: str, argv: Sequence[str]) -> _Child:
        child = await _Child.start(label, argv, self.logs / f"{label}.log")
        assert self._reaper is not None
        self._reaper.add(child.pid)
        return child

    async def _start_node(self, region: str) -> None:
        argv = _strictq(
            "queue-server", *self.cluster_args(), "--internal-secret", str(self.secret_path),
            "--node", region, "--region", region, "--zone", f"{region}-1",
            "--data-dir", str(self.data_dir / "nodes" / region),
            "--host", HOST, "--port", "0",
            "--cluster-partitions", str(self.partitions), "--replicas", str(self.replicas),
        )  # fmt: skip
        child = await self._spawn(f"node-{region}", argv)
        self._nodes[region] = child
        line = (await child.wait_for([NODE_LINE], self.node_timeout))[NODE_LINE]
        self._node_urls[region] = line.split()[-1]

    async def _start_edge(self, region: str) -> None:
        reach: list[str] = []
        for node in self.regions:
            if node != region:
                reach += ["--reach", f"{node}={self.relay_url(region, node)}"]
        argv = _strictq(
            "serve", *self.cluster_args(), "--internal-secret", str(self.secret_path),
            "--data-dir", str(self.data_dir / "edges" / region),
            "--host", HOST, "--port", "0", "--no-proxy", "--keys", str(self.keys_path),
            "--region", region, "--zone", f"{region}-1", "--edge-name", f"edge-{region}",
            *reach, "--traffic-window", f"{self.traffic_window:g}", *self.edge_args,
        )  # fmt: skip
        child = await self._spawn(f"edge-{region}", argv)
        self._edges[region] = child
        await child.wait_for([LISTENING, CLIENT_ENV], self.edge_timeout)

    async def _wait_settled(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        view: ClusterView | None = None
        while time.monotonic() < deadline:
            for child in self._nodes.values():
                if not child.running:
                    raise GeoError(child.failure(f"exited with {child.proc.returncode}"))
            with contextlib.suppress(Exception):  # JetStream electing a leader: look again
                view = await self.view()
                if view.settled():
                    return
            await asyncio.sleep(0.25)
        raise GeoError(f"strictq geo: the cluster did not settle within {SETTLE_TIMEOUT:g}s; see {self.logs}")

    # ----------------------------------------------------------------------------------- addresses
    @property
    def secret_path(self) -> Path:
        """The world's internal secret (queue_core.internal_auth), as `strictq cluster up` keeps it."""
        return self.data_dir / SECRET_FILE_NAME

    def cluster_args(self) -> list[str]:
        """`--cluster URLS --nats-credentials FILE`: how a `strictq` command reaches this world."""
        assert self.nats is not None, "the world is not started"
        return [
            "--cluster", ",".join(self.nats.client_urls),
            "--nats-credentials", str(credentials_path(self.data_dir)),
        ]  # fmt: skip

    def delay(self, a: str, b: str) -> float:
        """The simulated one-way delay between regions `a` and `b`, in seconds (0 within a region)."""
        return one_way(self.delays, a, b)

    @property
    def nodes(self) -> dict[str, str]:
        """Queue server name -> its region (a node is named after its region)."""
        return {region: region for region in self._nodes}

    def node_url(self, node: str) -> str:
        """The node's own URL (no simulated delay)."""
        return self._node_urls[node]

    def _port(self, node: str) -> int:
        return int(self._node_urls[node].rsplit(":", 1)[1].rstrip("/"))

    def relay(self, edge_region: str, node: str) -> DelayRelay:
        """The simulated link from the edge of `edge_region` to `node` (another region's); its `stats`."""
        return self._relays[(edge_region, node)]

    def relay_url(self, edge_region: str, node: str) -> str:
        return f"http://{HOST}:{self._relays[(edge_region, node)].port}"

    def edge_url(self, region: str) -> str:
        """The HTTPS URL of the region's edge (both faces: SQS at /, EmoDB at /queue/1)."""
        url = self._edges[region].value(LISTENING)
        assert url is not None
        return url

    def edge_pid(self, region: str) -> int:
        return self._edges[region].pid

    def node_pid(self, node: str) -> int:
        return self._nodes[node].pid

    def client_env(self, region: str) -> dict[str, str]:
        """The client environment of the region's edge (its client.env: STRICTQ_URL, STRICTQ_CA_FILE,
        keys, AWS_*), with AWS_DEFAULT_REGION set to the region, which the edge signs SQS requests for."""
        path = self._edges[region].value(CLIENT_ENV)
        assert path is not None
        env: dict[str, str] = {}
        for line in Path(path).read_text().splitlines():
            if line and not line.startswith("#") and "=" in line:
                name, _, value = line.partition("=")
                env[name.strip()] = value.strip()
        env["AWS_DEFAULT_REGION"] = region
        return env

    def edge_ca(self, region: str) -> Path:
        """The CA file that verifies the region's edge."""
        return Path(self.client_env(region)["STRICTQ_CA_FILE"])

    def credential(self, role: str) -> Credential:
        """The first credential of `role` (producer, worker, admin) in the key file every edge shares."""
        return next(c for c in KeyRing.load(self.keys_path).credentials if c.role == role)

    # -------------------------------------------------------------------------------- the cluster
    def partition_of(self, group: str) -> int:
        """The cluster partition a group's messages go to (as the edges route them)."""
        return partition_of(group, self.partitions)

    def group_in(self, partition: int, prefix: str = "g") -> str:
        """A group name (`<prefix>-<n>`) whose partition is `partition`."""
        for n in range(100_000):
            if self.partition_of(name := f"{prefix}-{n}") == partition:
                return name
        raise ValueError(f"no group {prefix}-<n> falls in partition {partition}")

    async def view(self) -> ClusterView:
        """The cluster now, as `strictq cluster status` reads it."""
        assert self.nc is not None and self.nats is not None, "the world is not started"
        js = self.nc.jetstream()
        layout = await read_layout(js)
        if layout is None:
            raise GeoError("strictq geo: the cluster has no layout yet")
        return await read_view(js, layout, tuple(self.nats.client_urls))

    async def status(self) -> dict[str, Any]:
        """`strictq cluster status --json`'s answer, read in this process."""
        return (await self.view()).to_json()

    async def owner(self, partition: int) -> str | None:
        """The node assigned `partition` now (None during a failover)."""
        return (await self.view()).partitions[partition].owner

    async def owner_region(self, partition: int) -> str:
        """The region of the node that owns and serves `partition` now; "" while none serves it."""
        view = await self.view()
        found = view.partitions[partition]
        node = view.node(found.owner) if found.owner is not None and found.serving else None
        return node.region if node is not None else ""

    # -------------------------------------------------------------------------------------- commands
    async def cli(self, *args: str, within: float = CLI_TIMEOUT) -> CliResult:
        """`strictq <args>` without blocking the loop (the relays run on it)."""
        proc = await asyncio.create_subprocess_exec(
            *_strictq(*args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), within)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise GeoError(
                f"strictq geo: `strictq {' '.join(args[:3])}` did not finish within {within:g}s"
            ) from None
        assert proc.returncode is not None
        return CliResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    async def cluster_cli(self, *args: str, within: float = CLI_TIMEOUT) -> CliResult:
        """`strictq cluster <args> --cluster ... --nats-credentials ...`; GeoError on a non-zero exit."""
        done = await self.cli("cluster", *args, *self.cluster_args(), within=within)
        if done.returncode != 0:
            raise GeoError(
                f"strictq geo: `strictq cluster {' '.join(args)}` exited {done.returncode}: "
                f"{done.stderr.strip()}"
            )
        return done

    async def move(self, partition: int, node: str, wait: float = 30.0) -> None:
        """`strictq cluster move PARTITION NODE`: a planned move, waited for."""
        await self.cluster_cli("move", str(partition), node, "--wait", f"{wait:g}", within=wait + CLI_TIMEOUT)

    async def plan(self) -> str:
        """`strictq cluster plan`'s table: the moves placement would make now and why (what a test shows
        when a partition did not move)."""
        done = await self.cli("cluster", "plan", *self.cluster_args())
        return (done.stdout + done.stderr).strip()

    async def set_policy(
        self,
        mode: str,
        *,
        schedule: str | None = None,
        day_seconds: float | None = None,
        hold: float | None = None,
        cooldown: float | None = None,
        max_moves_per_hour: int | None = None,
        min_share: float | None = None,
        min_saving_ms: float | None = None,
    ) -> dict[str, Any]:
        """`strictq cluster placement`: mode "off", "traffic" or "schedule" (with `schedule`, e.g.
        "00:00=eu,08:00=us,16:00=ap"); the other values as its flags. The policy it prints (--json)."""
        if mode == "schedule":
            if schedule is None:
                raise ValueError("mode schedule needs a schedule")
            args = ["--schedule", schedule]
        elif mode in ("off", "traffic"):
            args = [f"--{mode}"]
        else:
            raise ValueError(f"unknown placement mode {mode!r}: off, traffic or schedule")
        flags: dict[str, float | int | None] = {
            "--day-seconds": day_seconds,
            "--hold": hold,
            "--cooldown": cooldown,
            "--max-moves-per-hour": max_moves_per_hour,
            "--min-share": min_share,
            "--min-saving-ms": min_saving_ms,
        }
        for flag, value in flags.items():
            if value is not None:
                args += [flag, f"{value:g}"]
        done = await self.cluster_cli("placement", *args, "--json")
        policy: dict[str, Any] = json.loads(done.stdout)
        return policy
