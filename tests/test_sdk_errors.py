"""The SDK's setup errors (issue 14): settings that cannot work give one clear error naming the setting and
stop, instead of a traceback, a producer result `unknown`, or a worker retrying forever.

- STRICTQ_URL missing or invalid: `ConfigError`; `strictq.sdk.run` exits 2 with one line.
- A key the gateway refuses (401/403): `AuthRefused` naming STRICTQ_API_KEY (producer) or
  STRICTQ_WORKER_ID/STRICTQ_WORKER_SECRET (worker); the worker stops at its first poll, exit 1.
- A CA file that is not there: `ConfigError` naming STRICTQ_CA_FILE and the path; a CA that does not
  verify the gateway (or none: the system trust store): `TLSFailed` naming STRICTQ_CA_FILE.
- Only what may succeed later is retried (strictq.sdk.retry): no answer, 5xx, 429, a retriable body; a
  send only when it cannot have been applied.

Against the real in-process gateway over real TLS (a trustme CA: tests/gateway_support.py), real aiohttp
servers on 127.0.0.1 for the odd answers, and real subprocesses for the exit status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web
from gateway_support import Gateway
from test_sdk import config, serve

from strictq.sdk import (
    AuthRefused,
    ClientConfig,
    ConfigError,
    Entry,
    GatewayError,
    Message,
    Producer,
    SetupError,
    TLSFailed,
    Worker,
)
from strictq.sdk import serve as serve_workers
from strictq.sdk.retry import transient, unsent

ROOT = Path(__file__).resolve().parent.parent
WORKER_SCRIPT = Path(__file__).resolve().parent / "sdk_lifecycle_worker.py"
EXAMPLE_WORKER = ROOT / "examples" / "worker.py"
TEST_TIMEOUT = 20.0


async def handle(message: Message) -> None:
    return None


def env_for(gw: Gateway, **changes: str | None) -> dict[str, str]:
    """A worker's and producer's STRICTQ_* environment for the gateway, with `changes` (None: unset)."""
    worker, producer = gw.credential("worker-1"), gw.credential("producer-1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRICTQ_")}
    env.update(
        PYTHONPATH=str(ROOT),
        STRICTQ_URL=gw.url,
        STRICTQ_CA_FILE=str(gw.ca_file),
        STRICTQ_API_KEY=producer.secret,
        STRICTQ_WORKER_ID=worker.id,
        STRICTQ_WORKER_SECRET=worker.secret,
    )
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


async def run_script(argv: list[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    """A Python script as a real subprocess (the in-process gateway keeps serving meanwhile)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TEST_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def worker_argv(*extra: str) -> list[str]:
    return [str(WORKER_SCRIPT), "--queue", "orders", "--mode", "ok", *extra]


def one_error_line(stderr: str) -> str:
    """The script's stderr is one line (the error), without a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def free_port() -> int:
    """A loopback port nobody listens on (bound, then closed: connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ----------------------------------------------------------------------------------------- STRICTQ_URL
def test_the_url_must_be_a_gateway_url() -> None:
    for url in ("127.0.0.1:8443", "https://", "https://127.0.0.1:port", "ftp://127.0.0.1"):
        with pytest.raises(ConfigError, match="STRICTQ_URL") as caught:
            ClientConfig.from_env({"STRICTQ_URL": url})
        assert repr(url) in str(caught.value)
    with pytest.raises(ConfigError, match="STRICTQ_URL is not set"):
        ClientConfig.from_env({"STRICTQ_CA_FILE": "/tmp/ca.pem"})
    assert issubclass(ConfigError, SetupError) and issubclass(ConfigError, ValueError)


async def test_run_without_strictq_url_exits_2_with_one_line(gateway: Gateway) -> None:
    """`raise SystemExit(run(Worker(...)))` without STRICTQ_URL: one line naming it, exit 2."""
    code, _, err = await run_script(worker_argv(), env_for(gateway, STRICTQ_URL=None))
    line = one_error_line(err)
    assert code == 2, err
    assert "STRICTQ_URL is not set" in line, line


async def test_the_example_says_what_is_missing(gateway: Gateway) -> None:
    """examples/worker.py (the README's) without STRICTQ_URL: one line, exit 1, no traceback."""
    code, out, err = await run_script([str(EXAMPLE_WORKER)], env_for(gateway, STRICTQ_URL=None))
    line = one_error_line(err)
    assert code == 1 and out == "", (out, err)
    assert line.startswith("examples/worker.py: STRICTQ_URL is not set"), line


# ---------------------------------------------------------------------------------------- credentials
async def test_a_wrong_worker_secret_stops_the_worker_at_once(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway refuses the worker's key (403 invalid_api_key): `serve` returns 1 after the first poll,
    one line naming the worker's settings; nothing is retried."""
    ca_file = str(gateway.ca_file)
    wrong = ClientConfig(url=gateway.url, ca_file=ca_file, worker_id="worker-1", worker_secret="not-the-key")
    worker = Worker("orders", handle, config=wrong, backoff=(0.01, 0.05))
    caplog.set_level(logging.INFO, logger="strictq.sdk")
    async with asyncio.timeout(TEST_TIMEOUT):
        code = await serve_workers(worker)
    assert code == 1 and worker.stats.polls == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, errors
    assert "STRICTQ_WORKER_ID/STRICTQ_WORKER_SECRET" in errors[0] and "403" in errors[0], errors
    assert "backing off" not in caplog.text


async def test_a_wrong_worker_secret_exits_1_in_a_process(gateway: Gateway) -> None:
    env = env_for(gateway, STRICTQ_WORKER_SECRET="not-the-secret-123")
    code, _, err = await run_script(worker_argv(), env)
    assert code == 1, err
    line = one_error_line(err)
    assert "refuses the key in STRICTQ_WORKER_ID/STRICTQ_WORKER_SECRET" in line, line


async def test_the_producer_raises_for_a_wrong_key(gateway: Gateway) -> None:
    """A key the gateway refuses is one `AuthRefused` naming STRICTQ_API_KEY, not a status per entry; a
    worker's key (a role that may not send) too."""
    for key in ("not-the-secret-123", gateway.credential("worker-1").secret):
        async with Producer(config(gateway, "producer-1"), api_key=key) as producer:
            with pytest.raises(AuthRefused, match="STRICTQ_API_KEY") as caught:
                await producer.send_batch([Entry("orders", {"n": n}, f"g{n}") for n in range(3)])
            with pytest.raises(AuthRefused):  # a buffered send: the same error, raised to the caller
                await producer.send("orders", {"n": 9}, group="g9")
        assert caught.value.status == 403 and isinstance(caught.value, GatewayError)


# ------------------------------------------------------------------------------------------------ TLS
async def test_a_missing_ca_file_is_named_with_its_path(gateway: Gateway, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ca.pem"
    base = config(gateway)
    settings = dataclasses.replace(base, ca_file=str(missing))
    with pytest.raises(ConfigError, match="STRICTQ_CA_FILE") as caught:
        async with Producer(settings) as producer:
            await producer.send("orders", {"n": 1})
    assert str(missing) in str(caught.value) and "no such file" in str(caught.value)
    worker = Worker("orders", handle, config=settings)
    with pytest.raises(ConfigError, match="STRICTQ_CA_FILE"):
        await worker.run()
    not_pem = tmp_path / "not-a-ca.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ConfigError, match="not a PEM certificate file"):
        ClientConfig(url=gateway.url, ca_file=str(not_pem)).gateway_ssl()


async def test_a_missing_ca_file_exits_2_in_a_process(gateway: Gateway, tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem.missing"
    code, _, err = await run_script(worker_argv(), env_for(gateway, STRICTQ_CA_FILE=str(missing)))
    line = one_error_line(err)
    assert code == 2, err
    assert f"STRICTQ_CA_FILE={missing}: no such file" in line, line


@pytest.mark.parametrize("trust", ["system", "other-ca"])
async def test_an_unverifiable_certificate_stops_the_producer_and_the_worker(
    gateway: Gateway, tmp_path: Path, trust: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No STRICTQ_CA_FILE (the system trust store does not know the gateway's CA), or the CA of another
    server: the producer raises `TLSFailed` (no `unknown` results) and the worker stops after one poll
    instead of retrying CERTIFICATE_VERIFY_FAILED forever."""
    ca_file: str | None = None
    if trust == "other-ca":
        other = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other))
        ca_file = str(other)
    base = config(gateway)
    settings = dataclasses.replace(base, ca_file=ca_file)
    async with Producer(settings) as producer:
        with pytest.raises(TLSFailed, match="STRICTQ_CA_FILE") as caught:
            await producer.send_batch([Entry("orders", {"n": 1}, "g"), Entry("orders", {"n": 2})])
    message = str(caught.value)
    assert "CERTIFICATE_VERIFY_FAILED" in message or "certificate verify failed" in message, message
    assert (f"STRICTQ_CA_FILE={ca_file}" if ca_file else "STRICTQ_CA_FILE is not set") in message
    assert producer.requests == 2  # each request tried once: nothing retried

    worker = Worker("orders", handle, config=settings, backoff=(0.01, 0.05))
    caplog.set_level(logging.INFO, logger="strictq.sdk")
    async with asyncio.timeout(TEST_TIMEOUT):
        code = await serve_workers(worker)
    assert code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "cannot verify the certificate" in errors[0], errors
    assert await gateway.service.list_queues() == []  # nothing reached the queue


async def test_an_unverifiable_certificate_exits_1_in_a_process(gateway: Gateway) -> None:
    code, _, err = await run_script(worker_argv(), env_for(gateway, STRICTQ_CA_FILE=None))
    assert code == 1, err
    line = one_error_line(err)
    assert "cannot verify the certificate" in line and "STRICTQ_CA_FILE is not set" in line, line


async def test_https_to_a_plain_http_server_says_so() -> None:
    async def answer(request: web.BaseRequest) -> web.Response:
        return web.json_response({"success": True})

    async with serve(answer) as url:
        settings = ClientConfig(url=url.replace("http://", "https://"), api_key="producer-secret-0123")
        async with Producer(settings) as producer:
            with pytest.raises(TLSFailed, match="does the server speak HTTPS"):
                await producer.send("orders", {"n": 1})


# -------------------------------------------------------------------------------------------- retries
def gateway_error(status: int, body: Any = None, *, sent: bool = True) -> GatewayError:
    return GatewayError(f"HTTP {status}", status, body, sent=sent)


def test_what_is_retried() -> None:
    retriable = {"error": {"code": "shutting_down", "message": "", "retriable": True}}
    assert transient(gateway_error(0)) and transient(gateway_error(502)) and transient(gateway_error(429))
    assert transient(gateway_error(503, retriable)) and transient(gateway_error(400, retriable))
    for status in (400, 404, 409, 413):
        assert not transient(gateway_error(status, {"error": {"code": "x", "message": ""}}))
    assert not transient(AuthRefused("refused", 403)) and not transient(TLSFailed("unverified"))
    assert not transient(ValueError("not a gateway error"))
    # A send is retried only when it cannot have been applied.
    assert unsent(gateway_error(0, sent=False)) and unsent(gateway_error(429))
    assert unsent(gateway_error(503, retriable))
    assert not unsent(gateway_error(0)) and not unsent(gateway_error(502)) and not unsent(gateway_error(400))


async def test_the_producer_retries_only_what_cannot_have_been_sent() -> None:
    """A real server answers 429, then 503 with a retriable body, then takes the request: `sent`, after
    three requests. A 502 is not retried (the request may have gone through): `unknown`. A refused
    connection is retried for `retry_for`, then `failed` (it was never sent)."""
    answers = [429, 503, 200, 502]
    seen: list[int] = []

    async def gateway(request: web.BaseRequest) -> web.Response:
        status = answers[len(seen)]
        seen.append(status)
        if status == 200:
            return web.json_response({"success": True})
        body: dict[str, Any] = {"code": "unavailable", "message": "try later"}
        if status == 503:
            body["retriable"] = True
        return web.json_response({"error": body}, status=status)

    async with serve(gateway) as url:
        async with Producer(ClientConfig(url=url, api_key="producer-secret-0123"), retry_for=5.0) as producer:
            [first] = await producer.send_batch([Entry("orders", {"n": 1}, "g")])
            [second] = await producer.send_batch([Entry("orders", {"n": 2}, "g")])
    assert seen == [429, 503, 200, 502]
    assert first.status == "sent" and second.status == "unknown"

    closed = f"http://127.0.0.1:{free_port()}"
    async with Producer(ClientConfig(url=closed, api_key="producer-secret-0123"), retry_for=0.3) as producer:
        async with asyncio.timeout(TEST_TIMEOUT):
            [result] = await producer.send_batch([Entry("orders", {"n": 3}, "g")])
    assert result.status == "failed" and result.error is not None and not result.error.sent
