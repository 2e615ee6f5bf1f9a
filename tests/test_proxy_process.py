"""`strictq proxy` as a process: the start-up contract, the admin server, clean stop on SIGTERM (the wire
log closed and compressed), start-up failures that say why, `strictq proxy ca`, and `--processes 2`
(two processes, one port each, one parent; the SDK spreads workers over them by worker id)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from proxy_support import (
    ROOT,
    ProxyProcess,
    UpstreamCA,
    WorkerClient,
    free_port,
    http_records,
    make_tags,
    proxy_command,
    segment_files,
    start_proxy,
    unique,
    wait_marked,
    wait_records,
)

from strictq.sdk import ClientConfig

pytest_plugins = ["proxy_support"]  # its fixtures: backends, proxies, CAs


async def get(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            return resp.status, await resp.json()


async def test_startup_contract_admin_and_sigterm(proxy: ProxyProcess, backends) -> None:
    assert proxy.lines[0].startswith("strictq: listening on http://127.0.0.1:")
    assert proxy.lines[1] == f"strictq: proxy ca {proxy.ca_file}"
    assert proxy.lines[2].startswith("strictq: admin on http://127.0.0.1:")
    assert proxy.ca_file.is_file() and proxy.ca_file.is_relative_to(proxy.data_dir.resolve())
    assert (await get(f"{proxy.admin_url}/healthz")) == (200, {"status": "ok", "process": "proxy"})
    status, ready = await get(f"{proxy.admin_url}/readyz")  # no --control: nothing to wait for
    assert status == 200 and ready["ready"] is True
    status, metrics = await get(f"{proxy.admin_url}/metrics?format=json")
    assert status == 200 and metrics["control"]["synced"] is True

    marker = unique("stop")
    async with WorkerClient(proxy, tags=make_tags(message_id=marker)) as client:
        for backend in backends.all():
            assert (await client.call("GET", f"{backend.url}/{marker}")).status == 200
    assert proxy.terminate() == 0
    # clean stop: every record written, the segment closed and compressed, no open segment left
    names = [p.name for p in segment_files(proxy.wirelog_dir)]
    assert names and all(n.endswith(".jsonl.gz") for n in names), names
    assert len([r for r in http_records(proxy.wirelog_dir) if r["message_id"] == marker]) == 2
    assert "Traceback" not in proxy.log()


def test_port_in_use_fails_with_a_reason(tmp_path: Path, proxy_keys: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = proxy_command(tmp_path / "data", tmp_path / "wl", proxy_keys, None)
        argv[argv.index("--port") + 1] = str(port)
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "listening on" not in done.stdout
    assert f"cannot start the proxy: cannot listen on 127.0.0.1:{port} (in use" in done.stderr
    assert "--port" in done.stderr and "regular@" not in done.stderr  # our flag, not mitmproxy's advice


def test_bad_key_file_fails_with_a_reason(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text("[[credential]]\nid = 1\n")
    argv = proxy_command(tmp_path / "data", tmp_path / "wl", keys, None)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "credential #1" in done.stderr and done.stdout == ""


def test_proxy_ca_command_prints_the_ca(tmp_path: Path) -> None:
    """`proxy ca --data-dir D`: the CA of the proxy `strictq serve --data-dir D` runs (D/proxy/ca);
    `proxy --data-dir P ca`: a standalone proxy's (P/ca). The path on stdout, whose it is on stderr."""
    argv = [sys.executable, "-m", "strictq", "proxy", "ca", "--data-dir", str(tmp_path / "d")]
    first = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    path = Path(first.stdout.strip())
    assert path == (tmp_path / "d" / "proxy" / "ca" / "mitmproxy-ca-cert.pem").resolve()
    assert path.is_file() and b"BEGIN CERTIFICATE" in path.read_bytes()
    assert b"PRIVATE KEY" not in path.read_bytes()  # workers get the certificate only
    assert f"the egress proxy of `strictq serve --data-dir {tmp_path / 'd'}`" in first.stderr
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o700  # serve's data dir, private as serve makes it
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert again.stdout == first.stdout  # created once, then reused
    standalone = [sys.executable, "-m", "strictq", "proxy", "--data-dir", str(tmp_path / "p"), "ca"]
    alone = subprocess.run(standalone, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert Path(alone.stdout.strip()) == (tmp_path / "p" / "ca" / "mitmproxy-ca-cert.pem").resolve()
    assert f"`strictq proxy --data-dir {tmp_path / 'p'}`" in alone.stderr
    again = [sys.executable, "-m", "strictq", "proxy", "ca", "--data-dir", str(tmp_path / "p")]
    found = subprocess.run(again, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert found.stdout == alone.stdout  # a standalone proxy's data dir (ca/, no proxy/) is found too


def test_sdk_picks_one_proxy_per_worker() -> None:
    config = ClientConfig(url="https://gw", proxy_url="http://127.0.0.1:1, http://127.0.0.1:2")
    picks = {w: config.proxy_for(w) for w in (f"worker-{i}" for i in range(20))}
    assert set(picks.values()) == {"http://127.0.0.1:1", "http://127.0.0.1:2"}  # spread
    assert all(config.proxy_for(w) == url for w, url in picks.items())  # stable
    assert ClientConfig(url="https://gw", proxy_url="http://p:1").proxy_for("x") == "http://p:1"
    assert ClientConfig(url="https://gw").proxy_for("x") is None


async def test_two_processes(tmp_path: Path, proxy_keys: Path, upstream_ca: UpstreamCA, backends) -> None:
    proxy = start_proxy(tmp_path / "multi", "--processes", "2", keys=proxy_keys, upstream_ca=upstream_ca.path)
    try:
        assert len(proxy.urls) == 2 and len(set(proxy.urls)) == 2
        assert len(proxy.admin_urls) == 2
        processes = set()
        for admin in proxy.admin_urls:
            status, health = await get(f"{admin}/healthz")
            assert status == 200
            processes.add(health["process"])
        assert processes == {"proxy-0", "proxy-1"}  # each writes the wire log under its own name
        markers = []
        for url in proxy.urls:
            marker = unique("multi")
            markers.append(marker)
            async with WorkerClient(url, proxy_ca=proxy.ca_file, tags=make_tags(message_id=marker)) as client:
                for backend in backends.all():
                    assert (await client.call("GET", f"{backend.url}/{marker}")).status == 200
        writers = set()
        for marker in markers:
            records = await wait_marked(proxy, marker, 2)
            assert [r["call"] for r in records] == [1, 2]
            writers |= {r["writer"] for r in records}
        assert writers == {"proxy-0", "proxy-1"}
        child_pids = children_of(proxy.proc.pid)
        assert len(child_pids) == 2
    finally:
        code = proxy.terminate()
    assert code == 0
    assert not any(alive(pid) for pid in child_pids)  # SIGTERM to the parent stopped both
    names = [p.name for p in segment_files(proxy.wirelog_dir)]
    assert {n.split(".")[0] for n in names} == {"proxy-0", "proxy-1"}
    assert all(n.endswith(".jsonl.gz") for n in names), names


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("flag", [("--port", "70000"), ("--processes", "0"), ("--name", "bad name")])
def test_bad_flags(tmp_path: Path, proxy_keys: Path, flag: tuple[str, str]) -> None:
    argv = [*proxy_command(tmp_path / "d", tmp_path / "wl", proxy_keys, None), *flag]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "strictq:" in done.stderr


async def test_serve_runs_the_proxy_as_a_child(tmp_path: Path, backends) -> None:
    """`strictq serve` starts the proxy following its own control stream: a worker's tagged call (with
    the credential from client.env) passes once it is synchronised, lands in <data-dir>/wirelog, and
    SIGTERM to serve stops the proxy too."""
    data_dir = tmp_path / "serve"
    proc, lines = start_serve(data_dir)
    try:
        kinds = [line.split(" ")[1] for line in lines]
        assert kinds == ["listening", "ca", "keys", "proxy", "proxy", "client"], lines
        env = dict(
            line.split("=", 1)
            for line in (data_dir / "client.env").read_text().splitlines()
            if line and not line.startswith("#")
        )
        (child,) = children_of(proc.pid)
        marker = unique("serve")
        tags = make_tags(message_id=marker)
        async with WorkerClient(
            env["STRICTQ_PROXY_URL"],
            env["STRICTQ_WORKER_ID"],
            secret=env["STRICTQ_WORKER_SECRET"],
            proxy_ca=Path(env["STRICTQ_PROXY_CA_FILE"]),
            tags=tags,
        ) as client:
            for _ in range(100):  # 503 unsynced until the control stream is synchronised
                reply = await client.call("GET", f"{backends.http.url}/{marker}")
                if reply.status != 503:
                    break
                await asyncio.sleep(0.1)
        assert reply.status == 200, reply
        records = await wait_records(
            data_dir / "wirelog", lambda rs: any(r["message_id"] == marker for r in rs)
        )
        (record,) = [r for r in records if r["message_id"] == marker and r["action"] == "pass"]
        assert record["worker"] == env["STRICTQ_WORKER_ID"] and record["writer"] == "proxy"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0
    assert not alive(child)


def start_serve(data_dir: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`strictq serve` on a free port, and its six start-up lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "strictq", "serve", "--port", "0", "--data-dir", str(data_dir)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    return proc, [proc.stdout.readline().strip() for _ in range(6)]


async def test_not_ready_until_the_control_stream_is_synchronised(proxy_factory) -> None:  # type: ignore[no-untyped-def]
    """With --control pointing at nothing, the proxy is alive but not ready (fail closed)."""
    proxy = proxy_factory("--control", f"http://127.0.0.1:{free_port()}")
    assert (await get(f"{proxy.admin_url}/healthz"))[0] == 200
    status, body = await get(f"{proxy.admin_url}/readyz")
    assert status == 503 and body["ready"] is False


async def test_admin_errors_have_the_one_json_shape(proxy_factory) -> None:  # type: ignore[no-untyped-def]
    """The admin app answers as the gateway and the queue server do (docs/errors.md): /readyz's 503 keeps
    its fields and adds the `not_ready` error object; an unknown route or a wrong method is JSON too, not
    aiohttp's text/plain."""
    proxy = proxy_factory("--control", f"http://127.0.0.1:{free_port()}")
    status, body = await get(f"{proxy.admin_url}/readyz")
    assert status == 503, body
    assert (body["ready"], body["process"]) == (False, "proxy")
    assert body["reason"] == "control stream not synchronised"
    assert body["error"] == {"code": "not_ready", "message": body["reason"], "retriable": True}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.admin_url}/no-such-route") as resp:
            assert (resp.status, resp.content_type) == (404, "application/json")
            error = (await resp.json())["error"]
        assert error["code"] == "no_such_route" and "/no-such-route" in error["message"], error
        async with http.post(f"{proxy.admin_url}/readyz") as resp:
            assert (resp.status, resp.content_type) == (405, "application/json")
            assert (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_sigterm_lets_calls_in_flight_finish(proxy: ProxyProcess, backends) -> None:
    """A call in flight when SIGTERM arrives still gets its answer and its record; the listener is
    closed at once, so no new call is accepted meanwhile."""
    marker = unique("inflight")
    async with WorkerClient(proxy, tags=make_tags(message_id=marker)) as client:
        slow = asyncio.create_task(client.call("GET", f"{backends.http.url}/{marker}?delay=1.0"))
        while not backends.http.seen:  # noqa: ASYNC110 - the backend records it
            await asyncio.sleep(0.01)
        proxy.proc.send_signal(signal.SIGTERM)
        reply = await slow
    assert reply.status == 200
    assert await asyncio.to_thread(proxy.proc.wait, 20) == 0
    (record,) = [r for r in http_records(proxy.wirelog_dir) if r["message_id"] == marker]
    assert record["response"]["status"] == 200 and record["latency_ms"] >= 1000
