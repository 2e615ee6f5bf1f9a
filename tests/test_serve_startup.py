"""A newcomer's first start of `strictq serve` (issue 14): what goes wrong says so in one line, before
anything is touched, and what can run does.

- a second serve (or queue-server) on a data dir in use is refused by its lock before it opens anything
  (the running server's store keeps its epoch), naming the running one's pid;
- a busy port (the gateway's, the proxy's, the proxy's admin port) is one line naming the port and the
  flag, nothing of mitmproxy's, and nothing is written;
- a key file without a proxy-role credential: serve runs without the proxy and says so;
- `--upstream-ca` reaches a private HTTPS backend through serve's proxy, and `strictq proxy ca` finds
  that proxy's CA from the serve data dir.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from kit.process import CLIENT_ENV, LISTENING, PROXY_CA, ROOT, launch, running, strictq
from kit.until import until
from proxy_support import Backends, WorkerClient, make_tags, unique
from serve_support import Serve, start_serve

pytest_plugins = ["proxy_support"]  # its fixtures: backends, upstream CA

TIMEOUT = 60


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(strictq(*args), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The refusal: exit 2, nothing on stdout (no `listening on`), one line on stderr, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@contextlib.contextmanager
def listening() -> Iterator[int]:
    """A port something listens on, for the duration of the block."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def epochs(log: str) -> list[str]:
    return [
        line.split("epoch ", 1)[1].split(",")[0] for line in log.splitlines() if "store open: epoch" in line
    ]


def test_a_second_serve_on_a_data_dir_in_use_is_refused_first(tmp_path: Path) -> None:
    data_dir = tmp_path / "strictq"
    first = start_serve(data_dir)
    try:
        files = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}
        # The same ports as the first would collide too: the lock is what is reported.
        port = str(first.address()[1])
        second = run("serve", "--port", port, "--data-dir", str(data_dir), "--insecure-http")
        line = one_line(second)
        assert line == (
            f"strictq: a strictq serve is already running on {data_dir} (pid {first.pid}); stop it first, "
            "or give another --data-dir"
        )
        # A queue-server given serve's store directory (its data dir's queue/) is refused the same way.
        store = one_line(run("queue-server", "--port", "0", "--data-dir", str(data_dir / "queue")))
        assert f"a strictq serve is already running on {data_dir / 'queue'} (pid {first.pid})" in store
        assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()} == files  # untouched
        key = first.secret("producer")
        assert first.call("POST", "/queue/1/orders/send", key, {"n": 1})[0] == 200  # still serving
        assert first.running()
    finally:
        first.stop()
    again = start_serve(data_dir)  # its store was opened by the first only: epoch 1, then 2
    again.stop()
    assert epochs(again.full_log()) == ["1", "2"], again.full_log()


def test_queue_server_and_serve_share_the_lock(tmp_path: Path) -> None:
    data_dir = tmp_path / "queue"
    argv = strictq("queue-server", "--port", "0", "--data-dir", str(data_dir))
    with running(launch(argv, tmp_path / "queue-server.log")) as server:
        line = one_line(run("queue-server", "--port", "0", "--data-dir", str(data_dir)))
        assert line.startswith(f"strictq: a strictq queue-server is already running on {data_dir} ")
        assert f"(pid {server.pid})" in line
        line = one_line(run("serve", "--port", "0", "--no-proxy", "--data-dir", str(data_dir)))
        assert f"a strictq queue-server is already running on {data_dir} (pid {server.pid})" in line
        assert server.running()


def test_a_busy_queue_server_port_names_the_flag(tmp_path: Path) -> None:
    with listening() as port:
        line = one_line(run("queue-server", "--port", str(port), "--data-dir", str(tmp_path / "q")))
    assert line == (
        f"strictq: 127.0.0.1:{port}: cannot listen: port {port} is in use (the internal API's --port); stop "
        "what listens there, or give another --port"
    )


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        (
            "gateway",
            "(the gateway's --port); stop what listens there, or give another --port (make run PORT=...)",
        ),
        ("proxy", "(the egress proxy's --proxy-port); stop what listens there, or give another --proxy-port"),
        (
            "admin",
            "(the egress proxy's admin port, --proxy-port + 10); stop what listens there, or give "
            "another --proxy-port (make run PROXY_PORT=...)",
        ),
    ],
)
def test_a_busy_port_is_one_line_naming_its_flag(tmp_path: Path, which: str, expected: str) -> None:
    data_dir = tmp_path / "strictq"
    with listening() as busy:
        if which == "gateway":
            flags = ["--port", str(busy), "--no-proxy"]
        elif which == "proxy":
            flags = ["--port", "0", "--proxy-port", str(busy)]
        else:
            flags = ["--port", "0", "--proxy-port", str(busy - 10)]
        line = one_line(run("serve", *flags, "--data-dir", str(data_dir)))
    assert line.startswith(f"strictq: 127.0.0.1:{busy}: cannot listen: port {busy} is in use {expected}"), (
        line
    )
    assert "regular@" not in line and "mitmproxy" not in line
    assert not (data_dir / "keys.toml").exists()  # nothing was started or written


def test_gateway_and_proxy_on_one_port_is_named(tmp_path: Path) -> None:
    with listening() as port:
        pass  # free now (most likely): the two flags collide before any bind
    line = one_line(run("serve", "--port", str(port), "--proxy-port", str(port), "--data-dir", str(tmp_path)))
    assert f"the gateway's --port and the egress proxy's --proxy-port are both port {port}" in line


def test_an_upstream_ca_that_is_not_a_pem_certificate_is_refused(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    data_dir = tmp_path / "strictq"
    flags = ["--port", "0", "--proxy-port", "0", "--upstream-ca", str(not_pem)]
    line = one_line(run("serve", *flags, "--data-dir", str(data_dir)))
    assert line.startswith(f"strictq: {not_pem}: is not a PEM CA certificate ("), line
    assert "give --upstream-ca the PEM of a backend's CA" in line
    assert not (data_dir / "keys.toml").exists()  # refused before anything was written


def test_a_key_file_without_a_proxy_credential_runs_without_the_proxy(tmp_path: Path) -> None:
    from access.keys import Credential, new_secret, write_keys

    keys = tmp_path / "keys.toml"
    producer = Credential("k-producer", new_secret(), "producer", "dev")
    others = [Credential(f"k-{role}", new_secret(), role, "dev") for role in ("admin", "worker")]  # type: ignore[arg-type]
    write_keys(keys, [producer, *others])
    data_dir = tmp_path / "strictq"
    argv = strictq(
        "serve", "--port", "0", "--insecure-http", "--data-dir", str(data_dir), "--keys", str(keys)
    )
    serve = launch(argv, tmp_path / "serve.log", wait_for=[LISTENING, CLIENT_ENV], make=Serve)
    serve.url, serve.ca = serve.startup[LISTENING].split()[-1], None
    try:
        assert not any(line.startswith("strictq: proxy") for line in serve.lines), serve.lines
        assert serve.call("POST", "/queue/1/orders/send", producer.secret, {"n": 1})[0] == 200
        assert serve.running()
    finally:
        serve.stop()
    said = [line for line in serve.full_log().splitlines() if "proxy-role credential" in line]
    assert said == [
        f"strictq: {keys} has no proxy-role credential: running without the egress proxy (add one for "
        "workers' outbound calls to be fenced and recorded, docs/security.md; --no-proxy to say so)"
    ]
    assert "Traceback" not in serve.full_log()


async def test_upstream_ca_reaches_a_private_backend_and_proxy_ca_finds_its_ca(
    tmp_path: Path, backends: Backends
) -> None:
    """`strictq serve --upstream-ca` hands the CA to its proxy child: a worker's HTTPS call to a backend
    with a private certificate passes. `strictq proxy ca` (default var/strictq, or --data-dir) prints
    the CA that proxy signs with, and says whose it is."""
    data_dir = tmp_path / "var" / "strictq"
    argv = strictq(
        "serve", "--port", "0", "--data-dir", str(data_dir), "--upstream-ca", str(backends.ca.path)
    )
    serve = launch(argv, tmp_path / "serve.log", wait_for=[LISTENING, PROXY_CA, CLIENT_ENV])
    with running(serve):
        env = dict(
            line.split("=", 1)
            for line in (data_dir / "client.env").read_text().splitlines()
            if line and not line.startswith("#")
        )
        marker = unique("private")
        async with WorkerClient(
            env["STRICTQ_PROXY_URL"],
            env["STRICTQ_WORKER_ID"],
            secret=env["STRICTQ_WORKER_SECRET"],
            proxy_ca=Path(env["STRICTQ_PROXY_CA_FILE"]),
            tags=make_tags(message_id=marker),
        ) as client:

            async def passes() -> int | None:  # 503 until the control stream is synchronised
                with contextlib.suppress(aiohttp.ClientError):
                    status = (await client.call("GET", f"{backends.https.url}/{marker}")).status
                    return status if status != 503 else None
                return None

            assert await until(passes, 30, interval=0.1, what="a call through the proxy") == 200
        assert any(marker in seen.path for seen in backends.https.seen)

        printed = serve.startup[PROXY_CA]
        by_default = run("proxy", "ca", cwd=tmp_path)  # var/strictq, relative to where it runs
        assert by_default.returncode == 0, by_default.stderr
        assert by_default.stdout.strip() == printed
        assert "the egress proxy of `strictq serve --data-dir var/strictq`" in by_default.stderr
        named = run("proxy", "ca", "--data-dir", str(data_dir))
        assert named.stdout.strip() == printed
        assert f"`strictq serve --data-dir {data_dir}`" in named.stderr
