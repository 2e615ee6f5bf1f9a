"""The egress-proxy benchmark: one backend and one load generator, three ways to reach the backend.

Direct, through stock `mitmdump -q` (its default addons, no scripts), and through `strictq proxy` with
every addon on (auth, tagging, redaction, fence, lease guard synchronised with a real queue server's
control stream, capture to the wire log), with 1 and 2 proxy processes; each over HTTP and over HTTPS
(interception: the client trusts the proxy's CA, the proxy verifies the backend's). Closed loop at 50
concurrent requests; the load generator, the backend and the proxies share the machine's cores.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .servers import QueueServer, strictq_command

CONCURRENCY = 50
Progress = Any


class Proc:
    """A child process whose stdout lines are collected by a thread; always stopped by `stop()`."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True
        )
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None:
                raise RuntimeError(f"process exited ({self.proc.returncode}) before printing {pattern!r}")
            time.sleep(0.05)
        raise RuntimeError(f"no line matching {pattern!r} within {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on port {port} after {timeout} s")


def _load(
    st: Any,
    target: str,
    proxies: list[str],
    cas: list[str],
    auth: str | None,
    tagged: bool,
    pids: list[int] | None = None,
) -> dict:
    command = [sys.executable, "-m", "bench.proxy_load", "--target", target]
    for pid in pids or ():
        command += ["--watch-pid", str(pid)]
    command += ["--concurrency", str(CONCURRENCY), "--warmup", str(st.warmup), "--duration", str(st.duration)]
    for proxy in proxies:
        command += ["--proxy", proxy]
    for ca in cas:
        command += ["--ca", ca]
    if auth:
        command += ["--auth", auth]
    if tagged:
        command.append("--tagged")
    runs = []
    for _ in range(max(1, st.repeat)):
        done = subprocess.run(command, capture_output=True, text=True, timeout=st.warmup + st.duration + 120)
        if done.returncode != 0:
            raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    runs.sort(key=lambda r: r["rate"])
    median = runs[(len(runs) - 1) // 2]
    median["runs"] = [round(r["rate"]) for r in runs]
    return median


def scenario_proxy(st: Any, progress: Progress) -> None:
    import trustme

    from access.keys import write_development_keys

    work = st.work_dir / "proxy"
    work.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    backend_ca = work / "backend-ca.pem"
    ca.cert_pem.write_to_path(str(backend_ca))
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = work / "backend.pem", work / "backend.key"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    keys_path = work / "keys.toml"
    keys = write_development_keys(keys_path)
    worker = next(c for c in keys.credentials if c.role == "worker")
    auth = f"{worker.id}:{worker.secret}"

    started: list[Proc] = []
    core: QueueServer | None = None
    results: dict[str, Any] = {"concurrency": CONCURRENCY, "http": {}, "https": {}}
    try:
        backend = Proc(
            [sys.executable, "-m", "bench.proxy_backend", str(cert), str(key)],
            st.out_dir / "proxy-backend.log",
        )
        started.append(backend)
        m = backend.wait_for(r"backend http (\d+) https (\d+)")
        targets = {"http": f"http://127.0.0.1:{m[1]}", "https": f"https://127.0.0.1:{m[2]}"}

        def measure(setup: str, proxies: list[str], cas: list[str], tagged: bool, pids: list[int]) -> None:
            for mode, target in targets.items():
                figure = _load(
                    st, target, proxies, [str(backend_ca), *cas], auth if tagged else None, tagged, pids
                )
                results[mode][setup] = figure
                cpu = figure.get("proxy_cpu_us_per_request")
                progress(
                    f"proxy {mode:5} {setup:10} {figure['rate']:7,.0f} req/s  p50 {figure['p50_ms']:6.1f} ms"
                    f"  p99 {figure['p99_ms']:6.1f} ms  errors {sum(figure['errors'].values())}"
                    + (f"  proxy CPU {cpu:,.0f} µs/request" if cpu else "")
                )

        measure("direct", [], [], False, [])

        port = _free_port()
        confdir = work / "mitmdump"
        mitmdump = Proc(
            [
                str(Path(sys.executable).parent / "mitmdump"),
                "-q",
                *("--listen-host", "127.0.0.1", "--listen-port", str(port)),
                *("--set", f"confdir={confdir}", "--set", f"ssl_verify_upstream_trusted_ca={backend_ca}"),
            ],
            st.out_dir / "proxy-mitmdump.log",
        )
        started.append(mitmdump)
        _wait_port(port)
        mitm_ca = [str(confdir / "mitmproxy-ca-cert.pem")]
        measure("mitmdump", [f"http://127.0.0.1:{port}"], mitm_ca, False, [mitmdump.proc.pid])
        mitmdump.stop()

        # The control stream comes from a real queue server (ready = synchronised with it).
        core = QueueServer(
            work / "core", st.out_dir / "proxy-core.server.log", extra_args=["--keys", str(keys_path)]
        )
        core.start()
        for processes in (1, 2):
            setup = "strictq" if processes == 1 else "strictq x2"
            wirelog = work / f"wirelog-{processes}"
            ours = Proc(
                [
                    *strictq_command(),
                    "proxy",
                    *("--host", "127.0.0.1", "--port", "0", "--data-dir", str(work / f"proxy-{processes}")),
                    *("--keys", str(keys_path), "--control", core.url, "--wirelog", str(wirelog)),
                    *("--upstream-ca", str(backend_ca), "--processes", str(processes), "--admin-port", "0"),
                ],
                st.out_dir / f"proxy-strictq-{processes}.log",
            )
            started.append(ours)
            ours.wait_for(r"strictq: proxy ca (\S+)")
            listening = ours.wait_for(r"strictq: listening on (\S+)")[1]
            urls = listening.split(",")
            proxy_ca = ours.wait_for(r"strictq: proxy ca (\S+)")[1]
            assert len(urls) == processes, ours.lines
            _wait_ready(ours)
            measure(setup, urls, [proxy_ca], True, _proxy_pids(ours.proc.pid))
            ours.stop()
            results.setdefault("records", {})[setup] = _count_records(wirelog)
    finally:
        for proc in reversed(started):
            proc.stop()
        if core is not None:
            core.stop()
    for mode in ("http", "https"):
        row = results[mode]
        stock = row.get("mitmdump", {}).get("rate") or 0
        for setup in ("strictq", "strictq x2"):
            if stock and setup in row:
                row[setup]["vs_mitmdump"] = row[setup]["rate"] / stock
    st.results["proxy"] = results


def _proxy_pids(pid: int) -> list[int]:
    """The processes serving the proxy: `--processes N` runs N children under one parent."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    return [pid, *children]


def _wait_ready(proc: Proc, timeout: float = 30.0) -> None:
    """Every proxy process answers /readyz (control stream synchronised) before the load starts."""
    import urllib.request

    admins = proc.wait_for(r"strictq: admin on (\S+)")[1].split(",")
    deadline = time.monotonic() + timeout
    for admin in admins:
        while True:
            try:
                with urllib.request.urlopen(admin.rstrip("/") + "/readyz", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"proxy {admin} not ready after {timeout} s")
            time.sleep(0.1)


def _count_records(directory: Path) -> int:
    """Capture was really on: the records the proxies wrote during the run (all segments)."""
    from wirelog.reader import read_records

    return sum(1 for _ in read_records(directory))
