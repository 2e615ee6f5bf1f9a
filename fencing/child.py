"""The egress proxy as a child process of `strictq serve`.

The gateway and the proxy never share an event loop (mitmproxy swaps the loop's task factory and
exception handler while it runs), so `strictq serve` starts `strictq proxy` as a child, pointed at its
own control stream with its CA and the same key file, and stops it on shutdown. This module holds that
plumbing so the gateway's serve code stays a few lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fencing.process import ADMIN, LISTENING, PROXY_CA, die_with_parent, read_startup

START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class ProxyStartError(Exception):
    """The proxy child exited or stayed silent during start-up; its stderr went to ours."""


@dataclass
class ProxyChild:
    proc: asyncio.subprocess.Process
    url: str  # comma-separated with several processes: usable as STRICTQ_PROXY_URL as is
    ca: Path
    admin_url: str
    _drain: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def wait(self) -> int:
        return await self.proc.wait()

    async def stop(self) -> int:
        """SIGTERM (the proxy closes its wire log), then SIGKILL if it does not stop in time."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            self._drain.cancel()
        return self.proc.returncode if self.proc.returncode is not None else -1


async def start_proxy_child(
    *,
    host: str,
    port: int,
    admin_port: int,
    data_dir: Path,
    keys: Path,
    control: str | None,
    control_ca: Path | None,
    wirelog: Path | None = None,
    redaction_key_dir: Path | None = None,
    stop: asyncio.Event | None = None,
    extra_args: Sequence[str] = (),
    stderr: int | IO[bytes] | None = None,
    upstream_ca: Sequence[Path] = (),
) -> ProxyChild:
    """Start `strictq proxy` and wait for its start-up lines (or for `stop`: then it is stopped again).
    `extra_args`: more `strictq proxy` flags (replay passes `--replay-from DIR`); `stderr`: where its
    log goes (a file or descriptor; default: ours); `upstream_ca`: private CAs (PEM) it trusts for
    upstream certificates besides the system roots (`--upstream-ca`)."""
    argv = [
        *(sys.executable, "-m", "strictq", "proxy"),
        *("--host", host, "--port", str(port), "--admin-port", str(admin_port)),
        *("--data-dir", str(data_dir), "--keys", str(keys)),
    ]
    if control:
        argv += ["--control", control]
    if control_ca is not None:
        argv += ["--control-ca", str(control_ca)]
    if wirelog is not None:
        argv += ["--wirelog", str(wirelog)]
    if redaction_key_dir is not None:
        argv += ["--redaction-key-dir", str(redaction_key_dir)]
    for ca in upstream_ca:
        argv += ["--upstream-ca", str(ca)]
    argv += extra_args
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=die_with_parent,
    )
    startup = asyncio.create_task(read_startup(proc))
    waits: set[asyncio.Task[object]] = {startup}
    stopped = asyncio.create_task(stop.wait()) if stop is not None else None
    if stopped is not None:
        waits.add(stopped)
    try:
        done, _ = await asyncio.wait(waits, timeout=START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stopped is not None:
            stopped.cancel()
    child = ProxyChild(proc, "", Path(), "")
    if startup not in done:
        startup.cancel()
        await child.stop()
        raise ProxyStartError(
            "stopped while the proxy was starting" if done else "the proxy did not start in time"
        )
    try:
        lines = startup.result()
    except RuntimeError as exc:
        await child.stop()
        raise ProxyStartError(str(exc)) from None
    child.url, child.ca, child.admin_url = lines[LISTENING], Path(lines[PROXY_CA]), lines[ADMIN]
    child._drain = asyncio.create_task(_drain(proc))
    return child


async def _drain(proc: asyncio.subprocess.Process) -> None:
    """Keep reading the child's stdout so it never blocks on a full pipe."""
    assert proc.stdout is not None
    while await proc.stdout.readline():
        pass
