"""What authenticating the internal API costs the queue server: CPU per 1000 sends, three ways.

- `plain`: the internal API as it was, no credential (make_app with secret=None);
- `secret`: the shared secret checked by queue_core.internal_auth's middleware (what ships);
- `tls`: the secret over server-side TLS (a local CA's certificate, gateway.tls), pooled keep-alive
  connections as a gateway's session keeps them.

Each server runs in its own child process (this script with `--serve MODE`), so its CPU (utime + stime
from /proc) is the server's only; the client sends one message per request from `CONCURRENCY` tasks, the
modes taking turns round by round.
Bounded: `--sends` per round, `--rounds` rounds, everything on loopback, every child stopped.

    .venv/bin/python -m bench.internal_auth_bench [--sends 3000] [--rounds 3] [--json out.json]

docs/cluster.md ("Internal traffic") has the figures and the choice they support.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.procstat import cpu_seconds

MODES = ("plain", "secret", "tls")
CONCURRENCY = 8
WARMUP = 300
READY = "bench: port "


# ------------------------------------------------------------------------------ the server (child)
async def serve(mode: str, data_dir: Path) -> None:
    """One queue core behind the internal API in `mode`, on a free loopback port, until SIGTERM."""
    from aiohttp import web

    from gateway.tls import ensure_local_certificates, server_context
    from queue_core.internal_auth import InternalSecret
    from queue_core.server import make_app
    from queue_core.service import QueueService

    service = QueueService(data_dir / "queue")
    await service.start()
    secret = None if mode == "plain" else InternalSecret.ensure(data_dir / "internal.secret")[0]
    context = server_context(ensure_local_certificates(data_dir / "tls")) if mode == "tls" else None
    runner = web.AppRunner(make_app(service, secret=secret), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"{READY}{runner.addresses[0][1]}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await service.close()


# ------------------------------------------------------------------------------------- the client
class Child:
    def __init__(self, mode: str, data_dir: Path) -> None:
        self.mode = mode
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.internal_auth_bench", "--serve", mode, "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and not line.startswith(READY):
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"the {mode} server exited with {self.proc.returncode}")
        if not line.startswith(READY):
            self.stop()
            raise RuntimeError(f"the {mode} server did not start within 60 s")
        scheme = "https" if mode == "tls" else "http"
        self.url = f"{scheme}://127.0.0.1:{int(line[len(READY) :])}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def sends(session: aiohttp.ClientSession, url: str, count: int, round_no: int) -> None:
    """`count` one-message sends from CONCURRENCY tasks, each of its own groups."""
    counter = iter(range(count))

    async def one_task(task: int) -> None:
        for i in counter:
            body = orjson.dumps({"messages": [{"body": f"m{round_no}-{i}", "group": f"g{task}-{i % 50}"}]})
            async with session.post(
                url + "/v1/queues/bench/send", data=body, headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"send answered {response.status}")

    await asyncio.gather(*(one_task(t) for t in range(CONCURRENCY)))


def session_for(child: Child) -> aiohttp.ClientSession:
    """A pooled keep-alive session as a gateway keeps one: the secret as a default header (`secret`,
    `tls`), the local CA trusted (`tls`)."""
    headers: dict[str, str] = {}
    if child.mode != "plain":
        headers = {"X-Strictq-Internal": (child.data_dir / "internal.secret").read_text().strip()}
    context: ssl.SSLContext | bool = True
    if child.mode == "tls":
        context = ssl.create_default_context(cafile=str(child.data_dir / "tls" / "ca.pem"))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=0), headers=headers)


async def bench(count: int, rounds: int, root: Path) -> list[dict[str, Any]]:
    """Server CPU milliseconds per 1000 sends (median of `rounds`) and sends per second, per mode. The
    three servers run at once and the rounds take turns (plain, secret, tls, plain, ...), so a change in
    the machine's other load falls on every mode alike rather than on whichever ran last."""
    children: list[Child] = []
    sessions: list[aiohttp.ClientSession] = []
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for mode in MODES:
            children.append(Child(mode, root / mode))
            sessions.append(session_for(children[-1]))
        for child, session in zip(children, sessions, strict=True):
            async with session.put(child.url + "/v1/queues/bench", json={"attributes": {}}) as response:
                assert response.status == 200, await response.text()
            await sends(session, child.url, WARMUP, -1)
        for round_no in range(rounds):
            for child, session in zip(children, sessions, strict=True):
                cpu_before, started = cpu_seconds(child.proc.pid), time.monotonic()
                await sends(session, child.url, count, round_no)
                elapsed = time.monotonic() - started
                cpu[child.mode].append((cpu_seconds(child.proc.pid) - cpu_before) / count * 1000 * 1000)
                rates[child.mode].append(count / elapsed)
    finally:
        for session in sessions:
            await session.close()
        for child in children:
            child.stop()
    return [
        {
            "mode": mode,
            "cpu_ms_per_1000_sends": round(statistics.median(cpu[mode]), 1),
            "min_ms_per_1000_sends": round(min(cpu[mode]), 1),  # the least disturbed round
            "rounds_ms": [round(v, 1) for v in cpu[mode]],
            "sends_per_s": round(statistics.median(rates[mode])),
        }
        for mode in MODES
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sends", type=int, default=3000, help="sends per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.serve is not None:
        import uvloop

        uvloop.run(serve(args.serve, args.data_dir))
        return 0
    with tempfile.TemporaryDirectory(prefix="strictq-auth-bench-") as tmp:
        os.chmod(tmp, 0o700)
        results = asyncio.run(bench(args.sends, args.rounds, Path(tmp)))
    plain = results[0]["cpu_ms_per_1000_sends"]
    least = results[0]["min_ms_per_1000_sends"]
    head = f"{'mode':<8} {'server CPU ms / 1000 sends (median)':>36} {'vs plain':>9}"
    print(f"{head} {'min':>7} {'vs plain':>9}")
    for r in results:
        delta = (r["cpu_ms_per_1000_sends"] / plain - 1) * 100 if plain else 0.0
        low = (r["min_ms_per_1000_sends"] / least - 1) * 100 if least else 0.0
        print(
            f"{r['mode']:<8} {r['cpu_ms_per_1000_sends']:>36} {delta:>+8.1f}% "
            f"{r['min_ms_per_1000_sends']:>7} {low:>+8.1f}%"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
