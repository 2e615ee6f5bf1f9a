"""Build and run one mitmproxy `Master` with only what the egress proxy needs.

Not `DumpMaster`: it loads mitmproxy's ~31 default addons (every hook walks the whole chain, ~35% of
the CPU in measurements) and calls `sys.exit` on start-up errors. Here the chain is `Proxyserver`,
`NextLayer` (without it requests hang), `TlsConfig` (HTTPS interception with the CA in the data
directory) and our ordered addons. Without mitmproxy's `errorcheck` addon, start-up errors are only
logged, so `run_master` checks `listen_addrs()` itself and fails loudly.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitmproxy import exceptions
from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.tlsconfig import TlsConfig
from mitmproxy.master import Master
from mitmproxy.options import Options

from fencing import mitm_fastpath
from fencing.addons import ordered_addons
from fencing.ca import confdir
from fencing.mitm_fastpath import install_hook_cache
from fencing.runtime import ProxyRuntime

log = logging.getLogger("strictq.proxy")
CONTROL_PATH = "/admin/v1/control"  # docs/control-stream.md
DRAIN_GRACE = 5.0  # seconds calls in flight get to finish on SIGTERM


class StartupError(Exception):
    """The proxy could not start (port taken, bad option, unreadable file); the message says which."""


@dataclass(slots=True)
class ProxySettings:
    """One proxy process's configuration (the `strictq proxy` flags, minus `--processes`)."""

    host: str = "127.0.0.1"
    port: int = 8480
    data_dir: Path = Path("var/proxy")
    keys: Path = Path("var/strictq/keys.toml")
    wirelog: Path | None = None  # default <data-dir>/wirelog
    redaction: Path | None = None
    redaction_key_dir: Path | None = None  # where redaction.key lives (default: the data dir)
    upstream_trust: Path | None = None  # one PEM bundle (fencing.ca.write_upstream_trust); None = certifi
    control: str | None = None
    control_ca: Path | None = None
    control_key_id: str | None = None  # key-file id of the control stream's credential (its tenant is served)
    admin_host: str = "127.0.0.1"
    admin_port: int = 8490
    keep_tags: bool = False
    name: str = "proxy"
    wirelog_fsync: str = "interval"
    extra_options: dict[str, Any] = field(default_factory=dict)  # any other mitmproxy/addon option

    @property
    def wirelog_dir(self) -> Path:
        return self.wirelog if self.wirelog is not None else self.data_dir / "wirelog"

    def options(self) -> dict[str, Any]:
        """mitmproxy options (theirs and our addons'), applied once every addon has declared its own."""
        values: dict[str, Any] = {
            "mode": ["regular"],
            "listen_host": self.host,
            "listen_port": self.port,
            # Lazy: no upstream connection before the guards have decided (a blocked worker's call opens
            # no socket at all), and no upstream round trip to learn the certificate's names.
            "connection_strategy": "lazy",
            "upstream_cert": False,
            "ssl_verify_upstream_trusted_ca": str(self.upstream_trust) if self.upstream_trust else None,
            "strictq_keys": str(self.keys),
            "strictq_keep_tags": self.keep_tags,
            "strictq_redaction": str(self.redaction) if self.redaction else "",
            "strictq_redaction_key_dir": str(self.redaction_key_dir or self.data_dir),
            "strictq_wirelog": str(self.wirelog_dir),
            "strictq_wirelog_fsync": self.wirelog_fsync,
            "strictq_admin_host": self.admin_host,
            "strictq_admin_port": self.admin_port,
        }
        values.update(self.extra_options)
        return values

    def control_options(self) -> dict[str, Any]:
        """The guards' Control addon declares these; applied with `update_defer` so a missing one is a
        warning, not a crash."""
        return {
            "strictq_control": control_stream_url(self.control) if self.control else "",
            "strictq_control_ca": str(self.control_ca) if self.control_ca else "",
            "strictq_control_key_id": self.control_key_id or "",
        }


def control_stream_url(url: str) -> str:
    """`--control` may name the core's process (`https://host:port`) or the stream itself."""
    base = url.rstrip("/")
    if base.count("/") <= 2:  # scheme://authority, no path
        return base + CONTROL_PATH
    return url


class _TlsConfig(TlsConfig):
    """mitmproxy's TlsConfig, with the CRL path it checks every request's path against computed once per
    CA (its `crl_path` asks the CA certificate for its serial number on every request: ~1% of the CPU)."""

    name = "tlsconfig"

    def __init__(self) -> None:
        super().__init__()
        self._crl_path: tuple[object, str] | None = None

    def crl_path(self) -> str:
        ca = self.certstore.default_ca
        cached = self._crl_path
        if cached is None or cached[0] is not ca:
            cached = (ca, super().crl_path())
            self._crl_path = cached
        return cached[1]


class _Started:
    """Last in the chain: its `running` hook fires once the servers are set up and every other addon's
    `running` has returned (the admin server listens), which is when the start-up lines may be printed."""

    name = "strictq_started"

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


def build_master(settings: ProxySettings, runtime: ProxyRuntime) -> Master:
    """Must be called with the process's event loop running (mitmproxy binds the master to it)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # confdir first: TlsConfig loads (or creates) the CA as soon as it is added.
    opts = Options(confdir=str(confdir(settings.data_dir)))
    mitm_fastpath.install()  # before the first flow: mitmproxy's debug-only checks off (see the module)
    master = Master(opts, with_termlog=False)
    master.addons.add(Proxyserver(), NextLayer(), _TlsConfig(), *ordered_addons(runtime), _Started())
    install_hook_cache(master.addons)
    try:
        opts.update(**settings.options())
    except (exceptions.OptionsError, KeyError) as exc:
        raise StartupError(str(exc)) from exc
    control = settings.control_options()
    try:
        opts.update_defer(**control)
    except exceptions.OptionsError as exc:
        raise StartupError(str(exc)) from exc
    if settings.control and "strictq_control" in opts.deferred:
        log.warning("no addon declares the control-stream options; --control is ignored")
    return master


async def start_master(master: Master, runtime: ProxyRuntime) -> tuple[asyncio.Task[None], list[str]]:
    """Run the master in a task and wait until it listens. Returns the task and the proxy URLs; raises
    StartupError (after shutting the master down) if a listener or an addon failed to start."""
    started = master.addons.get("strictq_started")
    assert isinstance(started, _Started)
    task = asyncio.create_task(master.run(), name="mitmproxy-master")
    waiter = asyncio.create_task(started.event.wait(), name="mitmproxy-started")
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        exc = task.exception()
        raise StartupError(f"the proxy stopped while starting: {exc!r}")
    proxyserver = master.addons.get("proxyserver")
    addrs = proxyserver.listen_addrs() if proxyserver is not None else []
    problems = list(runtime.startup_errors)
    if not addrs:
        host, port = master.options.listen_host, master.options.listen_port
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        problems.insert(0, f"cannot listen on {address} (in use, or not an address of this host): --port")
    if problems:
        master.shutdown()
        try:
            await asyncio.wait_for(task, 10)
        except Exception:  # the start-up failure is what we report
            log.exception("while stopping after a failed start")
        raise StartupError("; ".join(problems))
    urls = [_url(addr) for addr in addrs]
    return task, urls


async def drain(master: Master, runtime: ProxyRuntime, grace: float = DRAIN_GRACE) -> None:
    """Before stopping: close the listening socket, then give calls in flight up to `grace` seconds to
    finish, so their records are written before the writer closes (keep-alive connections that are
    merely idle do not hold the stop up)."""
    proxyserver = master.addons.get("proxyserver")
    if proxyserver is not None:
        try:
            await proxyserver.servers.update([])
        except Exception:
            log.exception("while closing the listener")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while runtime.in_flight > 0 and loop.time() < deadline:  # noqa: ASYNC110 - a counter, polled
        await asyncio.sleep(0.02)
    if runtime.in_flight > 0:
        log.warning("stopping with %d calls still in flight", runtime.in_flight)


def _url(addr: tuple[Any, ...]) -> str:
    host, port = addr[0], addr[1]
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
