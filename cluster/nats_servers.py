"""Running JetStream servers on this machine: `strictq cluster up` and the tests start them here.

Why a module of its own: the replicated queue stands on NATS JetStream (Debian's `nats-server`, installed
by the Makefile), and everything that starts servers needs the same things: one private config per server
under `<data-dir>/nats/n<K>/` (0700 directories, 0600 files, and the servers run with umask 077 so their
own stores are private too), a random password made once and kept in `<data-dir>/nats/credentials`
(the system account's, for health checks over NATS, in `<data-dir>/nats/system.credentials`),
ports picked once and kept in `<data-dir>/nats/ports.json` (a restart is the same cluster at the same
addresses, so clients and routes find it again), a bounded wait until JetStream answers, and errors that
point at the server's log. No server opens nats-server's HTTP monitoring port: it has no login, and
would hand every local user the streams' layout and leaders; the start-up checks ask over NATS as the
system account (cluster.nats_system). Servers run in their own process group, so a Ctrl-C in a terminal
reaches the process that owns them, which stops them in order.

Servers are indexed from 0 (`client_urls[i]`); their names are n1..nN.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cluster.connect import credentials_path, gateway_credentials_path, system_credentials_path
from cluster.layout import LAYOUT_BUCKET
from cluster.names import check_node_name
from cluster.nats_roles import GATEWAY_USER, SYSTEM_USER, RoleLogin, authorization_lines
from cluster.nats_system import SystemLogin, SystemLoginRefused, ask
from wirelog.files import StartupError, file_faults, open_private, private_dir, write_private

BINARY = "nats-server"
FALLBACK_PATH = Path("/usr/sbin/nats-server")  # Debian's package installs it outside a user's PATH
MIN_VERSION = (2, 9, 0)
INSTALL = "apt-get install nats-server"
NATS_DIR = "nats"
PORTS_FILE = "ports.json"
CONFIG_FILE = "server.conf"
LOG_FILE = "server.log"
PID_FILE = "server.pid"
CLUSTER_NAME = "sq"
CLIENT_USER = "strictq"
ROUTE_USER = "route"
MAX_MEMORY_STORE = "64MB"
MAX_FILE_STORE = "2GB"
MAX_PAYLOAD = "8MB"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
POLL = 0.05
PORT_RETRIES = 3  # a fresh cluster whose picked port another process took meanwhile picks again
ZONE_TAG = "zone:"  # server_tags prefixes (placement tags); unique_tag names the zone's
REGION_TAG = "region:"
REPLICAS_MAX = 3  # the most replicas a stream has (cluster.layout): zones needed for zone-distinct replicas


class NatsServerMissing(StartupError):
    """No nats-server binary: the operator installs it (the Makefile does, when it is missing)."""

    def __init__(self, fallback: Path) -> None:
        super().__init__(
            BINARY,
            f"not found on PATH nor at {fallback}",
            "run `make cluster` or `make test` (they install it), or `apt-get install nats-server`",
        )


class NatsClusterError(RuntimeError):
    """A server would not start, answer or stop in time; the message names its log."""


def find_nats_server(path: str | None = None, fallback: Path | str = FALLBACK_PATH) -> str:
    """The nats-server to run: the first on `path` (default: $PATH), else `fallback`."""
    found = shutil.which(BINARY, path=path)
    if found is not None:
        return found
    fallback = Path(fallback)
    if fallback.is_file() and os.access(fallback, os.X_OK):
        return str(fallback)
    raise NatsServerMissing(fallback)


@functools.cache
def nats_server_version(binary: str) -> str:
    """`binary --version` as "2.9.10"; a StartupError if it does not run or is older than MIN_VERSION."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartupError(binary, f"does not run ({exc})", f"reinstall it: {INSTALL}") from None
    found = re.search(r"v?(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise StartupError(binary, "does not report a version", f"reinstall it: {INSTALL}")
    version = tuple(int(n) for n in found.groups())
    if version < MIN_VERSION:
        raise StartupError(
            binary,
            f"is version {found.group(0)}; strictq needs nats-server {_dotted(MIN_VERSION)} or later",
            "install a newer nats-server",
        )
    return ".".join(found.groups())


@dataclass(frozen=True)
class ServerPorts:
    client: int
    cluster: int | None  # routes; None for a single server


@dataclass(frozen=True)
class _Secrets:
    user: str
    password: str
    route_user: str
    route_password: str
    # The edges' restricted login and the cluster id its permissions name (cluster.nats_roles); None in a
    # data dir made before roles existed (one user for everything, as then).
    gateway_password: str | None = None
    cluster_id: str | None = None
    # The system account's login (cluster.nats_system), in a file of its own: made for old data dirs too.
    system_password: str | None = None


class NatsCluster:
    """`count` nats-server processes with JetStream, clustered (routes, one meta group) when count > 1.

    Synchronous on purpose: the tests and `strictq cluster up` start it before any event loop matters.
    `start()` on a data dir used before reuses its ports and password.

    `zones`/`regions` (one per server, "" for none) become the servers' `server_tags` (`zone:<z>`,
    `region:<r>`); with at least REPLICAS_MAX distinct zones the servers also get
    `jetstream { unique_tag: "zone:" }`, so JetStream never places two replicas of one stream (a partition,
    a bucket) in one zone. With fewer zones that constraint could not be met and R3 streams would fail to
    be created, so it is left out (replicas then land where JetStream picks)."""

    def __init__(
        self,
        data_dir: Path,
        count: int = 3,
        host: str = "127.0.0.1",
        *,
        binary: str | None = None,
        cluster_name: str = CLUSTER_NAME,
        zones: Sequence[str] | None = None,
        regions: Sequence[str] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("a NATS cluster needs at least one server")
        self.zones = _placement_names(zones, count, "zone")
        self.regions = _placement_names(regions, count, "region")
        self.data_dir = Path(data_dir)
        self.count = count
        self.host = host
        self.cluster_name = cluster_name
        self.binary = binary if binary is not None else find_nats_server()
        self.version = nats_server_version(self.binary)
        self.root = self.data_dir / NATS_DIR
        self.names = [f"n{k + 1}" for k in range(count)]
        self._ports: list[ServerPorts] = []
        self._secrets: _Secrets | None = None
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * count

    # ------------------------------------------------------------------------------- addresses
    @property
    def ports(self) -> list[ServerPorts]:
        if not self._ports:
            self._prepare()
        return list(self._ports)

    @property
    def client_urls(self) -> list[str]:
        """nats://host:port of each server (never with credentials)."""
        return [f"nats://{self._url_host}:{p.client}" for p in self.ports]

    @property
    def system_credentials(self) -> tuple[str, str]:
        """(user, password) of the system account: the servers' health and JetStream state (`monitor`)."""
        if self._secrets is None:
            self._prepare()
        assert self._secrets is not None and self._secrets.system_password is not None
        return SYSTEM_USER, self._secrets.system_password

    @property
    def credentials(self) -> tuple[str, str]:
        """(user, password) for clients."""
        if self._secrets is None:
            self._prepare()
        assert self._secrets is not None
        return self._secrets.user, self._secrets.password

    @property
    def gateway_credentials(self) -> tuple[str, str]:
        """(user, password) for the edges (`strictq serve --cluster`): the gateway role's restricted login
        (the server login for a data dir made before roles)."""
        if self._secrets is None:
            self._prepare()
        assert self._secrets is not None
        if self._secrets.gateway_password is None:
            return self.credentials
        return GATEWAY_USER, self._secrets.gateway_password

    @property
    def cluster_id(self) -> str | None:
        """The id the first queue server gives the cluster's layout (its permissions name it)."""
        if self._secrets is None:
            self._prepare()
        assert self._secrets is not None
        return self._secrets.cluster_id

    @property
    def _connect_host(self) -> str:
        """Where this machine reaches the servers (a wildcard listen address is reached on loopback)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)

    @property
    def _url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    def server_dir(self, i: int) -> Path:
        return self.root / self.names[i]

    def log_path(self, i: int) -> Path:
        return self.server_dir(i) / LOG_FILE

    def config_path(self, i: int) -> Path:
        return self.server_dir(i) / CONFIG_FILE

    # ------------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = START_TIMEOUT) -> Self:
        """Start every server not running yet and wait (bounded) until JetStream answers on all of them
        with one meta leader; on failure stop what was started and raise NatsClusterError."""
        for attempt in range(PORT_RETRIES):
            fresh = self._prepare()
            marks = {i: self._log_size(i) for i in range(self.count)}
            try:
                for i in range(self.count):
                    if self.pid(i) is None:
                        self._spawn(i)
                self._wait(range(self.count), time.monotonic() + timeout)
                return self
            except NatsClusterError as exc:
                self.stop()
                taken = any(self._port_taken(i, marks[i]) for i in marks)
                if fresh and taken and attempt + 1 < PORT_RETRIES:
                    (self.root / PORTS_FILE).unlink(missing_ok=True)
                    self._ports = []
                    continue
                if taken:
                    raise NatsClusterError(
                        f"{exc} (another process holds a port this data dir uses: free it, or remove "
                        f"{self.root / PORTS_FILE} to pick new ports)"
                    ) from None
                raise
        raise AssertionError("unreachable")

    def start_server(self, i: int, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Start server `i` again with its config and ports; `wait`: until it has rejoined JetStream."""
        self._prepare()
        if self.pid(i) is None:
            self._spawn(i)
        if wait:
            self._wait([i], time.monotonic() + timeout)

    def stop_server(self, i: int, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM server `i`, SIGKILL it if it has not exited within `timeout`."""
        self._stop([i], timeout)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to server `i` (SIGKILL, SIGSTOP, SIGCONT...); after SIGKILL, wait until it is gone."""
        proc = self._procs[i]
        if proc is None or proc.poll() is not None:
            raise NatsClusterError(f"nats-server {self.names[i]} is not running")
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(STOP_TIMEOUT)
            self._procs[i] = None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every server (SIGTERM, then SIGKILL after `timeout`); safe to call twice."""
        self._stop(range(self.count), timeout)

    def pid(self, i: int) -> int | None:
        """The pid of server `i` while it runs (stopped by SIGSTOP counts as running), else None."""
        proc = self._procs[i]
        if proc is None or proc.poll() is not None:
            return None
        return proc.pid

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ monitoring
    def monitor(self, i: int, endpoint: str, options: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Server `i`'s answer to a monitoring request (`healthz`, `jsz`, `routez`, `varz`...; `options`
        as the HTTP endpoint's query, e.g. {"streams": True}), asked over NATS as the system account on
        its client port; None if it does not answer. NatsClusterError if it refuses the login."""
        user, password = self.system_credentials
        try:
            return ask(
                self._connect_host, self.ports[i].client, SystemLogin(user, password), endpoint, options
            )
        except SystemLoginRefused as exc:
            raise NatsClusterError(
                f"{exc}: nats-server {self.names[i]} does not run with {self.config_path(i)}'s system "
                f"account (restart it, or check {system_credentials_path(self.data_dir)})"
            ) from None

    def healthy(self, i: int) -> bool:
        """Server `i` answers HEALTHZ with ok (JetStream enabled and current)."""
        answer = self.monitor(i, "healthz")
        return answer is not None and answer.get("status") == "ok"

    def jetstream_peers(self) -> dict[str, bool]:
        """The meta group as its leader sees it: server name -> current. Empty while there is no leader
        (or, for one server, {name: True} once JetStream runs)."""
        if self.count == 1:
            return {self.names[0]: True} if self.pid(0) is not None and self.healthy(0) else {}
        for i in range(self.count):
            if self.pid(i) is None:
                continue
            meta = (self.monitor(i, "jsz") or {}).get("meta_cluster") or {}
            if meta.get("leader") != self.names[i]:
                continue
            peers = {self.names[i]: True}
            for replica in meta.get("replicas") or []:
                if isinstance(replica, dict) and isinstance(replica.get("name"), str):
                    peers[replica["name"]] = bool(replica.get("current")) and not replica.get("offline")
            return peers
        return {}

    # -------------------------------------------------------------------------------- internals
    def _prepare(self) -> bool:
        """Directories, credentials, ports and configs; True if the ports were picked just now."""
        with file_faults(self.root):  # an unwritable data dir: one line naming it, not a traceback
            private_dir(self.data_dir)
            private_dir(self.root)
            for i in range(self.count):
                private_dir(self.server_dir(i))
            self._secrets = self._with_system_login(self._load_secrets())
            fresh = not self._ports and self._load_ports()
            for i in range(self.count):
                write_private(self.config_path(i), self._config(i), sync=False)
        return fresh

    def _load_secrets(self) -> _Secrets:
        path = credentials_path(self.data_dir)
        if path.exists():
            try:
                data = json.loads(path.read_bytes())
                found = _Secrets(
                    data["user"],
                    data["password"],
                    data["route_user"],
                    data["route_password"],
                    data.get("gateway_password"),
                    data.get("cluster"),
                )
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise StartupError(
                    path,
                    f"is not a JetStream credentials file ({exc})",
                    "restore it, or remove the data dir's nats/ directory to start a new cluster",
                ) from None
            self._write_gateway_credentials(found)
            return found
        made = _Secrets(
            CLIENT_USER,
            secrets.token_urlsafe(24),
            ROUTE_USER,
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(24),
            secrets.token_hex(4),
        )
        record = {
            "user": made.user,
            "password": made.password,
            "route_user": made.route_user,
            "route_password": made.route_password,
            "gateway_password": made.gateway_password,
            "cluster": made.cluster_id,
        }
        write_private(path, json.dumps(record, indent=1) + "\n")
        self._write_gateway_credentials(made)
        return made

    def _with_system_login(self, found: _Secrets) -> _Secrets:
        """`found` with the system account's password: read from its file, or made and written there
        (a data dir from before the system account gets one at its next start)."""
        path = system_credentials_path(self.data_dir)
        if path.exists():
            try:
                data = json.loads(path.read_bytes())
                user, password = data["user"], data["password"]
                if user != SYSTEM_USER or not isinstance(password, str) or not password:
                    raise ValueError(f"not the {SYSTEM_USER} user's login")
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise StartupError(
                    path,
                    f"is not the system account's credentials file ({exc})",
                    "remove it (the next start makes a new password and writes it into the servers' configs)",
                ) from None
        else:
            password = secrets.token_urlsafe(24)
            write_private(path, json.dumps({"user": SYSTEM_USER, "password": password}, indent=1) + "\n")
        return dataclasses.replace(found, system_password=password)

    def _write_gateway_credentials(self, made: _Secrets) -> None:
        """The edges' file (`--nats-credentials` of `strictq serve --cluster`): their login only."""
        if made.gateway_password is None:
            return
        path = gateway_credentials_path(self.data_dir)
        record = {"user": GATEWAY_USER, "password": made.gateway_password, "cluster": made.cluster_id}
        text = json.dumps(record, indent=1) + "\n"
        if not path.exists() or path.read_text() != text:
            write_private(path, text)

    def _load_ports(self) -> bool:
        """Read ports.json, or pick free ports and write it; True if picked now."""
        path = self.root / PORTS_FILE
        if path.exists():
            try:
                data = json.loads(path.read_bytes())
                servers = [ServerPorts(s["client"], s.get("cluster")) for s in data["servers"]]
                host = data["host"]
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise StartupError(path, f"is not a ports file ({exc})", "remove it (new ports)") from None
            if host != self.host or len(servers) != self.count:
                raise StartupError(
                    path,
                    f"records {len(servers)} JetStream server(s) on {host}, not {self.count} on {self.host}",
                    "use the same count and host as before, or another data dir",
                )
            self._ports = servers
            return False
        self._ports = _pick_ports(self.host, self.count)
        record = {
            "host": self.host,
            "servers": [
                {"name": n, "client": p.client, "cluster": p.cluster}
                for n, p in zip(self.names, self._ports, strict=True)
            ],
        }
        write_private(path, json.dumps(record, indent=1) + "\n")
        return True

    def _config(self, i: int) -> str:
        assert self._secrets is not None
        s, p = self._secrets, self._ports[i]
        directory = self.server_dir(i)
        lines = [
            "# Written by strictq (cluster.nats_servers) at each start: edits are overwritten.",
            f"server_name: {_q(self.names[i])}",
            f"listen: {_q(f'{self.host}:{p.client}')}",
            f"max_payload: {MAX_PAYLOAD}",
            f"pid_file: {_q(str(directory / PID_FILE))}",
            "jetstream {",
            f"  store_dir: {_q(str(directory))}",
            f"  max_memory_store: {MAX_MEMORY_STORE}",
            f"  max_file_store: {MAX_FILE_STORE}",
            *([f"  unique_tag: {_q(ZONE_TAG)}"] if self.zone_distinct else []),
            "}",
            *self._tags_lines(i),
            *authorization_lines(
                RoleLogin(s.user, s.password),
                None if s.gateway_password is None else RoleLogin(GATEWAY_USER, s.gateway_password),
                s.cluster_id,
                LAYOUT_BUCKET,
                _q,
                None if s.system_password is None else RoleLogin(SYSTEM_USER, s.system_password),
            ),
        ]
        if self.count > 1:
            assert p.cluster is not None
            routes = [
                f"nats://{s.route_user}:{s.route_password}@{self._url_host}:{q.cluster}"
                for j, q in enumerate(self._ports)
                if j != i
            ]
            lines += [
                "cluster {",
                f"  name: {_q(self.cluster_name)}",
                f"  listen: {_q(f'{self.host}:{p.cluster}')}",
                "  authorization {",
                f"    user: {_q(s.route_user)}",
                f"    password: {_q(s.route_password)}",
                "  }",
                "  routes: [",
                *(f"    {_q(r)}" for r in routes),
                "  ]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    @property
    def zone_distinct(self) -> bool:
        """Whether the servers span enough zones that JetStream is told to keep replicas zone-distinct."""
        return len({zone for zone in self.zones if zone}) >= REPLICAS_MAX

    def server_tags(self, i: int) -> list[str]:
        """Server `i`'s JetStream placement tags: `zone:<z>`, `region:<r>` (each only when set)."""
        tags = [f"{ZONE_TAG}{self.zones[i]}"] if self.zones[i] else []
        return tags + ([f"{REGION_TAG}{self.regions[i]}"] if self.regions[i] else [])

    def _tags_lines(self, i: int) -> list[str]:
        tags = self.server_tags(i)
        return [f"server_tags: [{', '.join(_q(tag) for tag in tags)}]"] if tags else []

    def _spawn(self, i: int) -> None:
        self._refuse_foreign(i)
        with open_private(self.log_path(i)) as log:
            self._procs[i] = subprocess.Popen(
                [self.binary, "-c", str(self.config_path(i))],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals come from its owner only
                umask=0o077,  # JetStream's files and directories are private like the rest
            )

    def _refuse_foreign(self, i: int) -> None:
        """A server of this data dir left running by an earlier, killed owner: say so (its ports are
        taken) instead of failing on the port."""
        try:
            pid = int((self.server_dir(i) / PID_FILE).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return
        if str(self.config_path(i)).encode() in cmdline:
            raise NatsClusterError(
                f"nats-server {self.names[i]} of {self.data_dir} is already running (pid {pid}), left by an "
                f"earlier start: stop it (kill {pid}) or use another data dir"
            )

    def _wait(self, indexes: Iterable[int], deadline: float) -> None:
        wanted = list(indexes)
        while True:
            for i in wanted:
                proc = self._procs[i]
                if proc is None or proc.poll() is not None:
                    code = proc.returncode if proc is not None else None
                    raise NatsClusterError(
                        f"nats-server {self.names[i]} exited (code {code}) while starting; see "
                        f"{self.log_path(i)}{self._last_error(i)}"
                    )
            if self._ready(wanted):
                return
            if time.monotonic() > deadline:
                logs = ", ".join(str(self.log_path(i)) for i in wanted)
                raise NatsClusterError(
                    f"JetStream did not answer on {', '.join(self.names[i] for i in wanted)} in time "
                    f"(no healthy server or no meta leader); see {logs}"
                )
            time.sleep(POLL)

    def _ready(self, wanted: list[int]) -> bool:
        if not all(self.healthy(i) for i in wanted):
            return False
        if self.count == 1:
            return True
        peers = self.jetstream_peers()
        return all(peers.get(self.names[i]) for i in wanted)

    def _stop(self, indexes: Iterable[int], timeout: float) -> None:
        procs = [(i, p) for i in indexes if (p := self._procs[i]) is not None]
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                proc.terminate()
        deadline = time.monotonic() + timeout
        for i, proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)
            self._procs[i] = None

    def _log_size(self, i: int) -> int:
        try:
            return self.log_path(i).stat().st_size
        except OSError:
            return 0

    def _tail(self, i: int, since: int = 0) -> str:
        try:
            with self.log_path(i).open("rb") as f:
                f.seek(since)
                return f.read()[-64_000:].decode(errors="replace")
        except OSError:
            return ""

    def _port_taken(self, i: int, since: int) -> bool:
        return "address already in use" in self._tail(i, since)

    def _last_error(self, i: int) -> str:
        errors = [line for line in self._tail(i).splitlines() if "[ERR]" in line or "[FTL]" in line]
        return f": {errors[-1].strip()}" if errors else ""


def _placement_names(names: Sequence[str] | None, count: int, what: str) -> list[str]:
    """One zone (or region) per server, checked: the names go into the servers' configs as tags."""
    if names is None:
        return [""] * count
    if isinstance(names, str) or len(names) != count:
        raise ValueError(f"give one {what} per JetStream server ({count}), not {names!r}")
    for name in names:
        if name and (problem := check_node_name(name, what)):
            raise ValueError(problem)
    return [str(name) for name in names]


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _q(value: str) -> str:
    """A string for the NATS config format (double-quoted, JSON escapes)."""
    return json.dumps(value)


def _pick_ports(host: str, count: int) -> list[ServerPorts]:
    """Free ports (a client port, and a route port when clustered), all held open together while picking
    so none is picked twice. No monitoring port: the servers answer health checks over NATS."""
    per_server = 2 if count > 1 else 1
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with ExitStack() as stack:
        picked: list[int] = []
        for _ in range(count * per_server):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            picked.append(sock.getsockname()[1])
    return [
        ServerPorts(ports[0], ports[1] if count > 1 else None)
        for ports in (picked[k * per_server : (k + 1) * per_server] for k in range(count))
    ]
