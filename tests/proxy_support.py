"""Shared fixtures for the egress-proxy tests: real TLS backends, a real `strictq proxy` process, and a
worker-like aiohttp client going through it.

- `upstream_ca`: a trustme CA (its PEM file is what the proxy gets as `--upstream-ca`);
- `backends`: aiohttp servers on 127.0.0.1, one plain HTTP, one HTTPS with a trustme certificate, that
  count accepted sockets and remember every request they saw (the tests prove what left the proxy);
- `proxy_keys`: a key file with the gateway fixture's credentials plus a `proxy` role credential;
- `start_proxy` / `running_proxy` / `proxy`: a `strictq proxy` subprocess on port 0 with a temporary data
  directory, wire-log directory and key file; it stops with SIGTERM (records flushed and segments closed);
- `WorkerClient`: the SDK's own tagged session (`strictq.sdk.outbound.tagged_session`) through the proxy,
  trusting the proxy's CA, with the worker's Proxy-Authorization;
- `read_records` / `segment_bytes`: the wire log read back (wirelog's reader) and its raw decompressed
  bytes (for "no secret on disk" checks).

Use it from a test module with `pytest_plugins = ["proxy_support"]` (its fixtures become available)
and import the helpers. Module-scoped `shared_ca` / `shared_proxy` / `shared_backends` save the seconds
a proxy start costs; tests on them tell their calls apart with `unique()` markers.
The guards' tests reuse these; keep the names and signatures stable.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import queue
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from aiohttp import web
from conftest import ChildProcess
from gateway_support import CREDENTIALS as GATEWAY_CREDENTIALS

from gateway.keys import Credential
from strictq.sdk.outbound import TAG_HEADERS, Tags, proxy_authorization, tagged_session

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0  # importing mitmproxy and creating its CA take a few seconds on a busy machine
STOP_TIMEOUT = 15.0
LISTENING = "strictq: listening on "
PROXY_CA = "strictq: proxy ca "
ADMIN = "strictq: admin on "

# The gateway fixture's credentials (worker-1, worker-2, admin-1, ...) plus the proxy's own, so one key
# file serves the gateway, the proxy's Proxy-Authorization and its control-stream connection.
PROXY_CREDENTIAL = Credential("proxy-1", "proxy-secret-0123456789", "proxy", "t1")
CREDENTIALS: list[Credential] = [*GATEWAY_CREDENTIALS, PROXY_CREDENTIAL]


def credential(key_id: str) -> Credential:
    found = next((c for c in CREDENTIALS if c.id == key_id), None)
    assert found is not None, key_id
    return found


def write_keys(path: Path, credentials: Sequence[Credential] = CREDENTIALS) -> Path:
    """A key file in the gateway's TOML format."""
    lines = []
    for c in credentials:
        prefixes = ", ".join(f'"{p}"' for p in c.prefixes)
        lines.append(
            f'[[credential]]\nid = "{c.id}"\nsecret = "{c.secret}"\nrole = "{c.role}"\n'
            f'tenant = "{c.tenant}"\nprefixes = [{prefixes}]\n\n'
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


@pytest.fixture
def proxy_keys(tmp_path: Path) -> Path:
    return write_keys(tmp_path / "keys.toml")


# ------------------------------------------------------------------------------------------ backends
@dataclass
class SeenRequest:
    """What a backend received: the proof of what left the proxy."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), None)

    @property
    def tag_headers(self) -> list[str]:
        tags = {t.lower() for t in TAG_HEADERS}
        return [k for k, _ in self.headers if k.lower() in tags]


@dataclass
class Backend:
    """One aiohttp server. Any path answers JSON echoing the request; query `status=N` sets the status,
    `delay=S` waits first; `respond` (a dict) is merged into every JSON answer (e.g. a secret field)."""

    url: str = ""  # http(s)://127.0.0.1:PORT
    accepted: int = 0  # sockets accepted (TLS or not), whether or not a request followed
    seen: list[SeenRequest] = field(default_factory=list)
    respond: dict[str, Any] = field(default_factory=dict)
    echo: bool = True  # False: answer without echoing the request (secrets echoed in strings would leak)
    response_headers: dict[str, str] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _runner: web.ServerRunner | None = None

    @property
    def host_port(self) -> str:
        return self.url.split("://", 1)[1]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        headers = list(request.headers.items())
        self.seen.append(SeenRequest(request.method, request.path, request.query_string, headers, body))
        delay = float(request.query.get("delay", "0") or 0)
        if delay:
            await asyncio.sleep(delay)
        status = int(request.query.get("status", "200") or 200)
        answer: dict[str, Any] = {"method": request.method, "path": request.path}
        if self.echo:
            answer.update(query=request.query_string, body=body.decode(errors="replace"))
        answer.update(self.respond)
        return web.Response(
            status=status,
            body=orjson.dumps(answer),
            content_type="application/json",
            headers=self.response_headers,
        )

    async def start(self, ssl_context: ssl.SSLContext | None) -> None:
        self._runner = web.ServerRunner(web.Server(self._handle, access_log=None), handle_signals=False)
        await self._runner.setup()
        protocol_factory = self._runner.server
        assert protocol_factory is not None

        def counting_factory() -> asyncio.Protocol:
            self.accepted += 1
            return protocol_factory()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(counting_factory, "127.0.0.1", 0, ssl=ssl_context)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    def reset(self) -> None:
        self.accepted = 0
        self.seen.clear()


@dataclass
class UpstreamCA:
    ca: trustme.CA
    path: Path  # PEM, for --upstream-ca

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
        return context


@dataclass
class Backends:
    http: Backend
    https: Backend
    ca: UpstreamCA

    def all(self) -> tuple[Backend, Backend]:
        return self.http, self.https

    def reset(self) -> None:
        for backend in self.all():
            backend.reset()


@pytest.fixture
def upstream_ca(tmp_path: Path) -> UpstreamCA:
    ca = trustme.CA()
    path = tmp_path / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return UpstreamCA(ca, path)


@contextlib.asynccontextmanager
async def running_backends(upstream_ca: UpstreamCA) -> AsyncIterator[Backends]:
    plain, secure = Backend(), Backend()
    await plain.start(None)
    await secure.start(upstream_ca.server_context())
    try:
        yield Backends(plain, secure, upstream_ca)
    finally:
        await plain.stop()
        await secure.stop()


@pytest.fixture
async def backends(upstream_ca: UpstreamCA) -> AsyncIterator[Backends]:
    async with running_backends(upstream_ca) as b:
        yield b


def free_port() -> int:
    """A port nothing listens on (for "backend down")."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------- proxy process
class ProxyProcess(ChildProcess):
    """One `strictq proxy` process (a parent with children under `--processes N`)."""

    LOG_TAIL = 6000
    STOP_TIMEOUT = STOP_TIMEOUT  # SIGTERM closes the wire log first

    def __init__(
        self, data_dir: Path, wirelog_dir: Path, proc: subprocess.Popen[bytes], log_path: Path
    ) -> None:
        self.data_dir = data_dir
        self.wirelog_dir = wirelog_dir
        self.urls: list[str] = []  # one per proxy process
        self.ca_file = Path()
        self.admin_urls: list[str] = []
        self.lines: list[str] = []  # stdout so far
        super().__init__(proc, log_path)

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def admin_url(self) -> str:
        return self.admin_urls[0]

    def read_startup(self, timeout: float = START_TIMEOUT) -> None:
        """Wait for the start-up contract: listening, proxy ca, admin (in that order)."""
        deadline = time.monotonic() + timeout
        while not self.admin_urls:
            try:
                line = self.stdout.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.kill()
                raise RuntimeError(f"proxy did not start (stdout {self.lines!r}); log:\n{self.log()}")
            self.lines.append(line)
            if line.startswith(LISTENING):
                self.urls = line[len(LISTENING) :].strip().split(",")
            elif line.startswith(PROXY_CA):
                self.ca_file = Path(line[len(PROXY_CA) :].strip())
            elif line.startswith(ADMIN):
                self.admin_urls = line[len(ADMIN) :].strip().split(",")
        assert self.lines[0].startswith(LISTENING), self.lines
        assert self.lines[1].startswith(PROXY_CA), self.lines


def proxy_command(
    data_dir: Path, wirelog_dir: Path, keys: Path, upstream_ca: Path | None, *extra_args: str
) -> list[str]:
    args = [
        *(sys.executable, "-m", "strictq", "proxy"),
        *("--host", "127.0.0.1", "--port", "0", "--admin-port", "0"),
        *("--data-dir", str(data_dir), "--keys", str(keys), "--wirelog", str(wirelog_dir)),
    ]
    if upstream_ca is not None:
        args += ["--upstream-ca", str(upstream_ca)]
    return [*args, *extra_args]


def start_proxy(
    base: Path,
    *extra_args: str,
    keys: Path | None = None,
    upstream_ca: Path | None = None,
    wirelog_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ProxyProcess:
    """Start `strictq proxy` on 127.0.0.1 port 0 (data under `base`) and wait for its start-up lines."""
    base.mkdir(parents=True, exist_ok=True)
    data_dir = base / "proxy"
    wirelog_dir = wirelog_dir or base / "wirelog"
    keys = keys or write_keys(base / "proxy-keys.toml")
    log_path = base / "proxy.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            proxy_command(data_dir, wirelog_dir, keys, upstream_ca, *extra_args),
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    process = ProxyProcess(data_dir, wirelog_dir, proc, log_path)
    process.read_startup()
    return process


@contextlib.contextmanager
def running_proxy(base: Path, *extra_args: str, **kwargs: Any) -> Iterator[ProxyProcess]:
    process = start_proxy(base, *extra_args, **kwargs)
    try:
        yield process
    finally:
        try:
            process.terminate()
        finally:
            if process.running():
                process.kill()


@pytest.fixture
def proxy(tmp_path: Path, proxy_keys: Path, upstream_ca: UpstreamCA) -> Iterator[ProxyProcess]:
    """A proxy trusting the backends' CA, with the shared key file; no control stream."""
    with running_proxy(tmp_path / "p", keys=proxy_keys, upstream_ca=upstream_ca.path) as process:
        yield process


@pytest.fixture
def proxy_factory(
    tmp_path: Path, proxy_keys: Path, upstream_ca: UpstreamCA
) -> Iterator[Callable[..., ProxyProcess]]:
    """Start proxies with extra arguments (`--control URL`, `--keep-tags`, ...); all stopped at the end."""
    started: list[ProxyProcess] = []

    def make(*extra_args: str, name: str | None = None, **kwargs: Any) -> ProxyProcess:
        kwargs.setdefault("keys", proxy_keys)
        kwargs.setdefault("upstream_ca", upstream_ca.path)
        process = start_proxy(tmp_path / (name or f"p{len(started)}"), *extra_args, **kwargs)
        started.append(process)
        return process

    yield make
    for process in started:
        try:
            process.terminate()
        except Exception:  # one stuck proxy must not hide the others
            pass
        finally:
            if process.running():
                process.kill()


# Module-scoped variants: one proxy (and one upstream CA) for a whole test module, since starting
# mitmproxy costs seconds. Tests sharing it tell their calls apart with `unique()` markers in the URL.
@pytest.fixture(scope="module")
def shared_ca(tmp_path_factory: pytest.TempPathFactory) -> UpstreamCA:
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("shared-ca") / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return UpstreamCA(ca, path)


@pytest.fixture(scope="module")
def shared_proxy(tmp_path_factory: pytest.TempPathFactory, shared_ca: UpstreamCA) -> Iterator[ProxyProcess]:
    base = tmp_path_factory.mktemp("shared-proxy")
    with running_proxy(base, keys=write_keys(base / "keys.toml"), upstream_ca=shared_ca.path) as process:
        yield process


@pytest.fixture
async def shared_backends(shared_ca: UpstreamCA) -> AsyncIterator[Backends]:
    async with running_backends(shared_ca) as b:
        yield b


def unique(prefix: str = "t") -> str:
    """A marker for one test's calls (path segment, message id) on a shared proxy."""
    import uuid

    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def with_marker(records: list[dict[str, Any]], marker: str) -> list[dict[str, Any]]:
    """Records whose URL or message id carries the marker, in the order they were written."""
    out = []
    for record in records:
        url = (record.get("request") or {}).get("url") or ""
        if marker in url or marker == record.get("message_id"):
            out.append(record)
    return out


async def wait_marked(
    proxy: ProxyProcess, marker: str, count: int, within: float = 10.0
) -> list[dict[str, Any]]:
    """Wait until `count` records carry the marker; returns them."""
    records = await wait_records(proxy.wirelog_dir, lambda rs: len(with_marker(rs, marker)) >= count, within)
    return with_marker(records, marker)


# ----------------------------------------------------------------------------------------- wire log
def segment_files(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file() and ".jsonl" in p.name)


def segment_bytes(directory: Path) -> bytes:
    """Every segment's content, decompressed: what "nothing secret reaches disk" is checked against.
    Also includes any other file in the directory, raw, so nothing escapes the search."""
    out = bytearray()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            with contextlib.suppress(OSError, EOFError):
                data = gzip.decompress(data)
        out += data + b"\n"
    return bytes(out)


def read_records(directory: Path) -> list[dict[str, Any]]:
    """All records in the directory, through wirelog's reader (segments closed or open, torn tail skipped)."""
    from wirelog.reader import read_records as read_wirelog

    if not directory.exists():
        return []
    return list(read_wirelog(directory))


def http_records(directory: Path) -> list[dict[str, Any]]:
    return [r for r in read_records(directory) if r.get("kind") == "http"]


async def wait_records(
    directory: Path,
    predicate: Callable[[list[dict[str, Any]]], bool],
    within: float = 10.0,
) -> list[dict[str, Any]]:
    """Poll the wire log until `predicate(http records)` holds (the writer flushes on a short timer)."""
    deadline = time.monotonic() + within
    while True:
        records = await asyncio.to_thread(http_records, directory)
        if predicate(records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"wire log never matched; last records: {records!r}")
        await asyncio.sleep(0.1)


# -------------------------------------------------------------------------------------------- worker
def make_tags(
    queue: str = "orders", message_id: str = "m-1", group: str = "g1", lease: int = 1, attempt: int = 1
) -> Tags:
    """An attempt as the SDK tracks it: each call through a session bound to it gets the next ordinal."""
    return Tags(queue, message_id, group, lease, attempt)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class WorkerClient:
    """A worker's outbound client: the SDK's tagged session through the proxy, trusting its CA.

    `credential` None sends no Proxy-Authorization; `secret` overrides the credential's secret (wrong
    password tests). An HTTPS call the proxy refuses at CONNECT comes back as a Reply with that status
    (aiohttp raises `ClientHttpProxyError`; tests want the status either way)."""

    def __init__(
        self,
        proxy: ProxyProcess | str,
        worker: str | None = "worker-1",
        *,
        secret: str | None = None,
        proxy_ca: Path | None = None,
        tags: Tags | None = None,
    ) -> None:
        self.proxy_url = proxy if isinstance(proxy, str) else proxy.url
        ca = proxy_ca if proxy_ca is not None else (None if isinstance(proxy, str) else proxy.ca_file)
        self.ssl = ssl.create_default_context(cafile=str(ca) if ca else None)
        if worker is None:
            self.proxy_headers: dict[str, str] = {}
        else:
            self.proxy_headers = proxy_authorization(worker, secret or credential(worker).secret)
        self.tags = tags
        self.connector: aiohttp.TCPConnector | None = None
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> WorkerClient:
        self.connector = aiohttp.TCPConnector(ssl=self.ssl, limit=100)
        self.session = tagged_session(
            self.connector,
            bound=self.tags,
            proxy_url=self.proxy_url,
            proxy_headers=self.proxy_headers,
            timeout=aiohttp.ClientTimeout(total=20),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        if self.connector is not None:
            await self.connector.close()

    async def call(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | str | None = None,
        json: Any = None,
    ) -> Reply:
        assert self.session is not None, "use `async with WorkerClient(...)`"
        try:
            async with self.session.request(method, url, headers=headers, data=data, json=json) as resp:
                body = await resp.read()
                return Reply(resp.status, dict(resp.headers), body)
        except aiohttp.ClientHttpProxyError as exc:  # the proxy refused the CONNECT
            return Reply(exc.status, dict(exc.headers or {}), b"")
