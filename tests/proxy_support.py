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
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from gateway_support import CREDENTIALS as GATEWAY_CREDENTIALS
from kit.backend import Backend, SeenRequest
from kit.process import ADMIN, LISTENING, PROXY_CA, ROOT, ChildProcess, launch, running, strictq
from kit.until import until

from access.keys import Credential
from strictq.sdk.outbound import Tags, proxy_authorization, tagged_session

__all__ = ["ROOT", "Backend", "SeenRequest"]  # re-exported for the proxy tests (kit owns them)

STOP_TIMEOUT = 15.0

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
    data_dir: Path
    wirelog_dir: Path
    urls: list[str]  # one per proxy process
    ca_file: Path
    admin_urls: list[str]

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def admin_url(self) -> str:
        return self.admin_urls[0]


def proxy_command(
    data_dir: Path, wirelog_dir: Path, keys: Path, upstream_ca: Path | None, *extra_args: str
) -> list[str]:
    args = [
        *strictq("proxy"),
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
    command = proxy_command(data_dir, wirelog_dir, keys, upstream_ca, *extra_args)
    process = launch(
        command, base / "proxy.log", wait_for=[LISTENING, PROXY_CA, ADMIN], env=env, make=ProxyProcess
    )
    # The start-up contract: listening, proxy ca, admin (in that order).
    assert process.lines[0].startswith(LISTENING), process.lines
    assert process.lines[1].startswith(PROXY_CA), process.lines
    process.data_dir, process.wirelog_dir = data_dir, wirelog_dir
    process.urls = process.startup[LISTENING].split(",")
    process.ca_file = Path(process.startup[PROXY_CA])
    process.admin_urls = process.startup[ADMIN].split(",")
    return process


@contextlib.contextmanager
def running_proxy(base: Path, *extra_args: str, **kwargs: Any) -> Iterator[ProxyProcess]:
    with running(start_proxy(base, *extra_args, **kwargs)) as process:
        yield process


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
        with contextlib.suppress(Exception):  # one stuck proxy must not hide the others
            process.stop()


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
    last: list[dict[str, Any]] = []

    async def matched() -> bool:
        nonlocal last
        last = await asyncio.to_thread(http_records, directory)
        return predicate(last)

    try:
        await until(matched, within, interval=0.1, what="wire log match")
    except AssertionError:
        raise AssertionError(f"wire log never matched; last records: {last!r}") from None
    return last


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
