"""The `strictq proxy` process: one mitmproxy master on its own event loop, or N of them as children.

mitmproxy swaps the running loop's task factory for an eager one and installs its own exception
handler while it runs, so the proxy never shares a loop (or a process) with the gateway: `strictq
serve` starts it as a child process. Its listener has no SO_REUSEPORT option, so `--processes N` runs N
processes on N ports under one parent that prints all their URLs; the SDK spreads workers over them by a
stable hash of the worker id (STRICTQ_PROXY_URL may be a comma-separated list).

Start-up contract (docs/contracts.md), once it accepts connections:
    strictq: listening on http://127.0.0.1:PORT[,http://127.0.0.1:PORT2...]
    strictq: proxy ca <path>
    strictq: admin on http://127.0.0.1:APORT[,...]
SIGTERM/SIGINT stop it cleanly: in-flight hooks finish, the wire-log writer is flushed and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fencing.ca import ensure_ca, write_upstream_trust
from wirelog import logsafe

if TYPE_CHECKING:
    from fencing.master import ProxySettings

log = logging.getLogger("strictq.proxy")
LISTENING = "strictq: listening on "
PROXY_CA = "strictq: proxy ca "
ADMIN = "strictq: admin on "
CHILD_START_TIMEOUT = 60.0
CHILD_STOP_TIMEOUT = 15.0


@dataclass(slots=True)
class ProxyCommand:
    """Everything `strictq proxy` was given (the flags, with `--upstream-ca` still a list)."""

    host: str
    port: int
    data_dir: Path
    keys: Path
    control: str | None
    control_ca: Path | None
    wirelog: Path | None
    redaction: Path | None
    redaction_key_dir: Path | None
    upstream_ca: list[Path]
    admin_host: str
    admin_port: int
    processes: int
    keep_tags: bool
    name: str
    wirelog_fsync: str
    replay_from: Path | None = None  # replay mode: answer every call from these recordings
    replay_mask: Path | None = None
    control_key_id: str | None = None  # the control stream's credential (default: first proxy one)

    def replay_options(self) -> dict[str, object]:
        """The mimic addon's replay options (fencing.addons.mimic), or none."""
        if self.replay_from is None:
            return {}
        return {
            "strictq_replay": True,
            "strictq_mimic_wirelog": str(self.replay_from),
            "strictq_replay_mask": str(self.replay_mask) if self.replay_mask else "",
        }


def configure_logging() -> None:
    logsafe.install()  # control characters escaped, malformed requests one WARNING line (issue 11)
    # mitmproxy logs every client connect/disconnect at INFO: too much for a busy egress proxy.
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    logging.getLogger("mitmproxy.addons.proxyserver").addFilter(_drop_listen_advice)


def _drop_listen_advice(record: logging.LogRecord) -> bool:
    """mitmproxy's "failed to listen ... Try `--mode regular@PORT`" is advice for its own command line;
    the start-up check (fencing.master.start_master) reports the port with our flag instead."""
    return "failed to listen" not in record.getMessage()


def run(command: ProxyCommand) -> int:
    """Entry point of `strictq proxy`; returns the exit code."""
    configure_logging()
    command.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        ca = ensure_ca(command.data_dir)  # before any child: they would race to create it
        trust = write_upstream_trust(command.data_dir, command.upstream_ca)
    except OSError as exc:
        print(f"strictq: {exc}", file=sys.stderr, flush=True)
        return 2
    if command.processes > 1:
        return asyncio.run(_run_parent(command))
    from fencing.master import ProxySettings

    settings = ProxySettings(
        host=command.host,
        port=command.port,
        data_dir=command.data_dir,
        keys=command.keys,
        wirelog=command.wirelog,
        redaction=command.redaction,
        redaction_key_dir=command.redaction_key_dir,
        upstream_trust=trust,
        control=command.control,
        control_ca=command.control_ca,
        control_key_id=command.control_key_id,
        admin_host=command.admin_host,
        admin_port=command.admin_port,
        keep_tags=command.keep_tags,
        name=command.name,
        wirelog_fsync=command.wirelog_fsync,
        extra_options=command.replay_options(),
    )
    return run_single(settings, ca)


def run_single(settings: ProxySettings, ca: Path) -> int:
    """One proxy process on a loop of its own (uvloop: the proxy is CPU-bound in the event loop)."""
    import uvloop

    return uvloop.run(_serve(settings, ca))


async def _serve(settings: ProxySettings, ca: Path) -> int:
    from fencing.master import StartupError, build_master, drain, start_master
    from fencing.runtime import ProxyRuntime

    runtime = ProxyRuntime(name=settings.name)
    try:
        master = build_master(settings, runtime)
    except StartupError as exc:
        print(f"strictq: cannot start the proxy: {exc}", file=sys.stderr, flush=True)
        return 2
    loop = asyncio.get_running_loop()
    # Handlers before the listening line: a SIGTERM right after it must still stop cleanly.
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        task, urls = await start_master(master, runtime)
    except StartupError as exc:
        print(f"strictq: cannot start the proxy: {exc}", file=sys.stderr, flush=True)
        return 1
    # Everything built so far (mitmproxy, cryptography, the addons) lives as long as the process: out of
    # the collector's way, so its full collections scan only what requests allocate.
    gc.freeze()
    print(f"{LISTENING}{urls[0]}", flush=True)
    print(f"{PROXY_CA}{ca}", flush=True)
    if runtime.admin_url:
        print(f"{ADMIN}{runtime.admin_url}", flush=True)
    stop_requested = asyncio.create_task(stopping.wait())
    done, _ = await asyncio.wait({task, stop_requested}, return_when=asyncio.FIRST_COMPLETED)
    if stop_requested in done:
        for signum in (signal.SIGTERM, signal.SIGINT):  # a second signal: stop without waiting
            loop.add_signal_handler(signum, master.shutdown)
        await drain(master, runtime)
        master.shutdown()
    else:
        stop_requested.cancel()
    await task
    named = "" if settings.name == "proxy" else f" ({settings.name})"  # not "proxy proxy stopped"
    print(f"strictq: proxy stopped{named}", file=sys.stderr, flush=True)
    return 0


# ------------------------------------------------------------------------------------ --processes N
def child_argv(command: ProxyCommand, index: int) -> list[str]:
    """The `strictq proxy` command line of child `index` (ports counted up from the given ones)."""
    argv = [
        *(sys.executable, "-m", "strictq", "proxy", "--processes", "1"),
        *("--host", command.host, "--port", str(command.port + index if command.port else 0)),
        *("--admin-host", command.admin_host),
        *("--admin-port", str(command.admin_port + index if command.admin_port else 0)),
        *("--data-dir", str(command.data_dir), "--keys", str(command.keys)),
        *("--name", f"{command.name}-{index}", "--wirelog-fsync", command.wirelog_fsync),
    ]
    if command.control:
        argv += ["--control", command.control]
    if command.control_ca:
        argv += ["--control-ca", str(command.control_ca)]
    if command.control_key_id:
        argv += ["--control-key-id", command.control_key_id]
    if command.wirelog:
        argv += ["--wirelog", str(command.wirelog)]
    if command.redaction:
        argv += ["--redaction", str(command.redaction)]
    if command.redaction_key_dir:
        argv += ["--redaction-key-dir", str(command.redaction_key_dir)]
    for ca in command.upstream_ca:
        argv += ["--upstream-ca", str(ca)]
    if command.keep_tags:
        argv.append("--keep-tags")
    if command.replay_from:
        argv += ["--replay-from", str(command.replay_from)]
    if command.replay_mask:
        argv += ["--replay-mask", str(command.replay_mask)]
    return argv


def die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the parent dies (even by SIGKILL), so a crashed parent
    never leaves an orphan proxy holding its port (Linux prctl; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def read_startup(proc: asyncio.subprocess.Process) -> dict[str, str]:
    """The child's start-up lines, by prefix, until its admin line."""
    assert proc.stdout is not None
    found: dict[str, str] = {}
    while ADMIN not in found:
        raw = await proc.stdout.readline()
        if not raw:
            raise RuntimeError(f"proxy process {proc.pid} exited during start-up (code {await proc.wait()})")
        line = raw.decode(errors="replace").rstrip("\n")
        for prefix in (LISTENING, PROXY_CA, ADMIN):
            if line.startswith(prefix):
                found[prefix] = line[len(prefix) :].strip()
    return found


async def _run_parent(command: ProxyCommand) -> int:
    """Start N children, print their URLs as one contract, forward SIGTERM, and exit when they have."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    children: list[asyncio.subprocess.Process] = []
    code = 0
    try:
        for index in range(command.processes):
            children.append(
                await asyncio.create_subprocess_exec(
                    *child_argv(command, index),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                    preexec_fn=die_with_parent,
                )
            )
        startup = asyncio.gather(*(read_startup(c) for c in children))
        stopped = asyncio.create_task(stop.wait())
        waits: set[asyncio.Future[Any]] = {startup, stopped}
        done, _ = await asyncio.wait(waits, timeout=CHILD_START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if startup not in done:
            startup.cancel()
            with contextlib.suppress(BaseException):
                await startup
            if not stop.is_set():
                print("strictq: the proxy processes did not start in time", file=sys.stderr, flush=True)
                code = 1
            return code
        try:
            lines = startup.result()
        except RuntimeError as exc:
            print(f"strictq: cannot start the proxy: {exc}", file=sys.stderr, flush=True)
            code = 1
            return code
        print(LISTENING + ",".join(found[LISTENING] for found in lines), flush=True)
        print(PROXY_CA + lines[0][PROXY_CA], flush=True)
        print(ADMIN + ",".join(found[ADMIN] for found in lines), flush=True)
        # Children's later stdout is drained so a chatty child never blocks on a full pipe.
        drains = [asyncio.create_task(_drain(c)) for c in children]
        exits = [asyncio.create_task(c.wait()) for c in children]
        await asyncio.wait({stopped, *exits}, return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            print("strictq: a proxy process exited; stopping the others", file=sys.stderr, flush=True)
            code = 1
        for task in drains:
            task.cancel()
        return code
    finally:
        await _stop_children(children)


async def _drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    while await proc.stdout.readline():
        pass


async def _stop_children(children: Sequence[asyncio.subprocess.Process]) -> None:
    for child in children:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            await asyncio.wait_for(child.wait(), CHILD_STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
