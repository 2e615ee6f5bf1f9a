"""The fence API (PUT/GET/DELETE /admin/v1/fences), its durability, and `strictq fence/unfence/fences`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import ROOT, ServerProcess
from control_stream_support import admin_call, core_with_admin, open_stream, secret_of, server_keys
from gateway_support import Gateway
from store_support import STORE_FILE, stored_fences

from queue_core.fences import Fence, FenceFileError, FenceRegistry, InvalidFence, NotFenced

FENCE = {"mode": "block", "reason": "calls the payment API twice"}


async def call(
    gateway: Gateway,
    method: str,
    path: str,
    body: Any = None,
    *,
    key_id: str = "admin-1",
    raw: bytes | None = None,
) -> tuple[int, Any]:
    key = gateway.credential(key_id).secret
    return await admin_call(gateway.url, method, path, key, body, raw=raw, ca_file=gateway.ca_file)


# ------------------------------------------------------------------------------------------- the API
async def test_fence_list_replace_unfence(gateway: Gateway) -> None:
    store = gateway.service.data_dir / STORE_FILE
    status, fence = await call(gateway, "PUT", "/admin/v1/fences/worker-1", {**FENCE, "ttl": 600})
    assert status == 200
    assert fence["worker"] == "worker-1" and fence["mode"] == "block" and fence["reason"] == FENCE["reason"]
    assert fence["expires"] == pytest.approx(fence["since"] + 600)
    # Durable before the answer: the store already holds it.
    assert stored_fences(store) == [fence]

    assert await call(gateway, "GET", "/admin/v1/fences") == (200, {"fences": [fence]})
    status, replaced = await call(
        gateway, "PUT", "/admin/v1/fences/worker-1", {"mode": "mimic", "reason": "r"}
    )
    assert status == 200 and replaced["mode"] == "mimic" and replaced["expires"] is None
    assert await call(gateway, "GET", "/admin/v1/fences") == (200, {"fences": [replaced]})

    assert await call(gateway, "DELETE", "/admin/v1/fences/worker-1") == (
        200,
        {"worker": "worker-1", "unfenced": True},
    )
    assert stored_fences(store) == []
    status, body = await call(gateway, "DELETE", "/admin/v1/fences/worker-1")
    assert (status, body["error"]["code"]) == (404, "not_fenced")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"mode": "silence", "reason": "x"}, "bad_mode"),
        ({"reason": "x"}, "bad_mode"),
        ({"mode": "block"}, "bad_reason"),
        ({"mode": "block", "reason": ""}, "bad_reason"),
        ({"mode": "block", "reason": "   "}, "bad_reason"),
        ({"mode": "block", "reason": 7}, "bad_reason"),
        ({"mode": "block", "reason": "x" * 501}, "bad_reason"),
        ({"mode": "block", "reason": "x", "ttl": 0}, "bad_ttl"),
        ({"mode": "block", "reason": "x", "ttl": -5}, "bad_ttl"),
        ({"mode": "block", "reason": "x", "ttl": "10m"}, "bad_ttl"),
        ({"mode": "block", "reason": "x", "ttl": True}, "bad_ttl"),
        (["block"], "bad_request"),
        (None, "bad_request"),
    ],
)
async def test_bad_fence_input_is_400(gateway: Gateway, body: Any, code: str) -> None:
    raw = b"" if body is None else None
    status, answer = await call(gateway, "PUT", "/admin/v1/fences/worker-1", body, raw=raw)
    assert status == 400, answer
    assert answer["error"]["code"] == code and answer["error"]["message"]
    assert await call(gateway, "GET", "/admin/v1/fences") == (200, {"fences": []})


async def test_invalid_json_and_boundary_reason(gateway: Gateway) -> None:
    status, answer = await call(gateway, "PUT", "/admin/v1/fences/worker-1", raw=b"{mode: block")
    assert (status, answer["error"]["code"]) == (400, "bad_request")
    status, _ = await call(
        gateway, "PUT", "/admin/v1/fences/worker-1", {"mode": "block", "reason": "x" * 500}
    )
    assert status == 200


async def test_unknown_worker_is_404(gateway: Gateway) -> None:
    for worker in ("nobody", "producer-1", "admin-1"):  # not a credential, or not of role worker
        status, body = await call(gateway, "PUT", f"/admin/v1/fences/{worker}", FENCE)
        assert (status, body["error"]["code"]) == (404, "unknown_worker"), worker
    # Another tenant's admin cannot fence (or unfence) this tenant's worker.
    status, body = await call(gateway, "PUT", "/admin/v1/fences/worker-1", FENCE, key_id="other-1")
    assert (status, body["error"]["code"]) == (404, "unknown_worker")
    await call(gateway, "PUT", "/admin/v1/fences/worker-1", FENCE)
    status, body = await call(gateway, "DELETE", "/admin/v1/fences/worker-1", key_id="other-1")
    assert (status, body["error"]["code"]) == (404, "unknown_worker")


async def test_fence_api_auth(gateway: Gateway) -> None:
    url, ca = gateway.url, gateway.ca_file
    for key in (None, "no-such-secret-0123456789"):
        for method, path in (("GET", "/admin/v1/fences"), ("PUT", "/admin/v1/fences/worker-1")):
            status, body = await admin_call(url, method, path, key, FENCE, ca_file=ca)
            assert (status, body["error"]["code"]) == (401, "unauthorized")
    for key_id in ("producer-1", "worker-1"):
        for method, path in (
            ("GET", "/admin/v1/fences"),
            ("PUT", "/admin/v1/fences/worker-2"),
            ("DELETE", "/admin/v1/fences/worker-2"),
        ):
            status, body = await call(gateway, method, path, FENCE, key_id=key_id)
            assert (status, body["error"]["code"]) == (403, "forbidden"), (key_id, method)


async def test_refence_is_a_new_event(gateway: Gateway) -> None:
    admin = gateway.credential("admin-1").secret
    async with open_stream(gateway.url, admin, ca_file=gateway.ca_file) as stream:
        await stream.catch_up()
        await call(gateway, "PUT", "/admin/v1/fences/worker-2", FENCE)
        await call(gateway, "PUT", "/admin/v1/fences/worker-2", {"mode": "mimic", "reason": "again"})
        first, second = await stream.next(), await stream.next()
    assert (first.event, second.event) == ("fence", "fence")
    assert (first.data["mode"], second.data["mode"]) == ("block", "mimic")


# ---------------------------------------------------------------------------------------- durability
async def test_registry_round_trip_and_atomic_file(tmp_path: Path) -> None:
    path = tmp_path / "fences.json"
    registry = FenceRegistry(path)
    registry.load()  # no file yet: no fences
    async with registry.lock:
        await registry.put(Fence("w1", "block", "r", 1.0, None))
        await registry.put(Fence("w2", "mimic", "r2", 2.0, 10.0))
        await registry.remove("w1")
        with pytest.raises(NotFenced):
            await registry.remove("w1")
    assert sorted(os.listdir(tmp_path)) == ["fences.json"]  # no temporary file left over
    again = FenceRegistry(path)
    again.load()
    assert again.sorted() == [Fence("w2", "mimic", "r2", 2.0, 10.0)]
    assert again.next_expiry() == 10.0


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"version": 2, "fences": []}', b'{"version": 1, "fences": [{"worker": "w"}]}'],
)
def test_malformed_fence_file_refuses_to_load(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fences.json"
    path.write_bytes(content)
    with pytest.raises(FenceFileError, match=r"fences\.json"):
        FenceRegistry(path).load()


async def test_python_api_validates_like_the_http_api(tmp_path: Path) -> None:
    async with core_with_admin(tmp_path / "core") as core:
        with pytest.raises(InvalidFence) as info:
            await core.hub.fence("worker-1", "bogus", "r")  # type: ignore[arg-type]
        assert info.value.code == "bad_mode"
        with pytest.raises(InvalidFence):
            await core.hub.fence("worker-1", "block", "r", ttl=float("inf"))
        with pytest.raises(NotFenced):
            await core.hub.unfence("worker-1")
        assert core.hub.fences() == []


# ----------------------------------------------------------------------------------------------- CLI
def strictq(
    server: ServerProcess | None, *args: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRICTQ_")}
    if server is not None:
        env["STRICTQ_URL"] = server.url
    if key is not None:
        env["STRICTQ_ADMIN_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "strictq", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_fence_fences_unfence(server: ServerProcess) -> None:
    keys = server_keys(server.data_dir)
    admin = secret_of(keys, "admin")
    done = strictq(
        server, "fence", "worker-1", "--mode", "mimic", "--reason", "flaky backend", "--ttl", "30m", "--json",
        key=admin,
    )
    assert done.returncode == 0, done.stderr
    fence = orjson.loads(done.stdout)
    assert fence["worker"] == "worker-1" and fence["mode"] == "mimic"
    assert fence["expires"] == pytest.approx(fence["since"] + 1800)

    table = strictq(server, "fences", key=admin)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:4] == ["WORKER", "MODE", "SINCE", "EXPIRES"]
    assert row.split()[:2] == ["worker-1", "mimic"] and row.endswith("flaky backend")

    listed = strictq(server, "fences", "--json", key=admin)
    assert [orjson.loads(line) for line in listed.stdout.splitlines()] == [fence]

    # --admin-key overrides the environment.
    done = strictq(server, "unfence", "worker-1", "--json", "--admin-key", admin, key="wrong-key-0123456789")
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {"worker": "worker-1", "unfenced": True}
    assert strictq(server, "fences", key=admin).stdout.strip() == "no fenced workers"

    again = strictq(server, "unfence", "worker-1", key=admin)
    assert again.returncode == 1 and "404 not_fenced" in again.stderr
    wrong = strictq(server, "fences", key="wrong-key-0123456789")
    assert wrong.returncode == 1 and "401 unauthorized" in wrong.stderr
    unknown = strictq(server, "fence", "ghost", "--mode", "block", "--reason", "x", key=admin)
    assert unknown.returncode == 1 and "404 unknown_worker" in unknown.stderr


def test_cli_usage_errors_exit_2(server: ServerProcess) -> None:
    admin = secret_of(server_keys(server.data_dir), "admin")
    cases = [
        (("fences",), None, "STRICTQ_ADMIN_KEY"),
        (("fence", "worker-1", "--mode", "block", "--reason", "x", "--ttl", "soon"), admin, "--ttl"),
        (("fence", "worker-1", "--mode", "block", "--reason", "x", "--ttl", "0"), admin, "positive"),
        (("fence", "worker-1", "--mode", "freeze", "--reason", "x"), admin, "--mode"),
        (("fence", "worker-1", "--mode", "block"), admin, "--reason"),
    ]
    for args, key, message in cases:
        done = strictq(server, *args, key=key)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    # Against a queue-server there is no client.env: the missing key is named where it is, keys.toml.
    done = strictq(server, "fences", "--queue-server", server.url)
    assert done.returncode == 2 and "keys.toml" in done.stderr, done.stderr
    assert "client.env" not in done.stderr, done.stderr
    helped = strictq(None, "fence", "--help")
    assert helped.returncode == 0 and "STRICTQ_ADMIN_KEY" in helped.stdout and "mimic" in helped.stdout


def test_cli_without_a_server_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "strictq", "fences"],
        cwd=ROOT,
        env={**os.environ, "STRICTQ_URL": "http://127.0.0.1:9", "STRICTQ_ADMIN_KEY": "k" * 20},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "cannot reach" in done.stderr


def test_queue_server_with_a_missing_key_file_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "strictq", "queue-server", "--port", "0"),
            *("--data-dir", str(tmp_path / "d"), "--keys", str(tmp_path / "nope.toml")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "nope.toml" in done.stderr
