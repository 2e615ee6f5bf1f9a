"""`strictq search` as a process: the story, --json, exit codes, and no JVM/mitmproxy/aiohttp loaded;
and the gateway's `GET /admin/v1/search` returning the same document as the CLI."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from spark_support import SampleIndex, brute_force

from access.keys import Credential, KeyRing
from queue_core.control import ControlHub
from queue_core.service import QueueService
from strictq.serve import make_edge_app

ROOT = Path(__file__).resolve().parent.parent
ADMIN = Credential("admin-1", "admin-secret-0123456789", "admin", "t1")
PRODUCER = Credential("producer-1", "producer-secret-0123456789", "producer", "t1")
# The sample's records carry no tenant: only an operator (every tenant) sees them (queue_core.scope).
OPERATOR = Credential("ops-1", "operator-secret-0123456789", "operator", "ops")


def strictq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strictq", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _failing_message(sample: SampleIndex) -> str:
    for message_id in sample.traffic.message_ids:
        records = brute_force(sample.wirelog, message_id)
        if any(r["kind"] == "http" and (r.get("response") or {}).get("status", 200) >= 500 for r in records):
            if any(r["kind"] == "delivery" and r["receive_count"] == 2 for r in records):
                return message_id
    raise AssertionError("the sample has no retried failing message")


def test_search_prints_the_story_in_time_order(spark_sample: SampleIndex) -> None:
    message_id = _failing_message(spark_sample)
    done = strictq("search", "--index", str(spark_sample.index), "--message-id", message_id, "--explain")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    expected = brute_force(spark_sample.wirelog, message_id)
    assert len(lines) == 1 + len(expected)
    assert lines[0].startswith(f"message {message_id} · ") and "(0 retries)" not in lines[0]
    assert [line.split()[1] for line in lines[1:]] == [r["kind"] for r in expected]
    calls = [line for line in lines[1:] if line.split()[1] == "http"]
    assert any(" -> 5" in line and "ms" in line for line in calls)  # status and latency of every call
    assert "row group(s) read" in done.stderr


def test_search_json_and_exit_codes(spark_sample: SampleIndex) -> None:
    index = str(spark_sample.index)
    message_id = random.Random(2).choice(spark_sample.traffic.message_ids)
    done = strictq("search", "--index", index, "--message-id", message_id, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["records"] == brute_force(spark_sample.wirelog, message_id)
    assert doc["summary"]["records"] == len(doc["records"]) and doc["lookup"]["files"] >= 1

    absent = strictq("search", "--index", index, "--message-id", "no-such-message")
    assert absent.returncode == 1 and absent.stdout == ""
    for args, message in [
        (("--message-id", "bad id!"), "malformed message id"),
        (("--message-id", "x" * 200), "malformed message id"),
        (("--message-id", "m-1", "--since", "yesterday"), "not a time"),
        (("--message-id", "m-1", "--since", "1h", "--until", "2h"), "--since is after --until"),
        (("--message-id", "m-1", "--status", "7xx"), "--status"),
        ((), "give --message-id"),
    ]:
        bad = strictq("search", "--index", index, *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert message in bad.stderr and "Traceback" not in bad.stderr
    missing = strictq("search", "--index", str(spark_sample.index.parent / "none"), "--message-id", "m-1")
    assert missing.returncode == 2 and "no index at" in missing.stderr


def test_search_loads_no_jvm_mitmproxy_or_aiohttp(spark_sample: SampleIndex) -> None:
    message_id = spark_sample.traffic.message_ids[0]
    code = (
        "import sys, io, contextlib\n"
        "from strictq.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['search', '--index', {str(spark_sample.index)!r}, '--message-id', {message_id!r}])\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "heavy = sorted(loaded & {'pyspark', 'py4j', 'mitmproxy', 'aiohttp'})\n"
        "print(rc, ','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], done.stdout


def test_index_and_errors_refuse_bad_input_before_starting_spark(
    spark_sample: SampleIndex, tmp_path: Path
) -> None:
    cases = [
        (("index", "--wirelog", str(tmp_path / "none"), "--index", str(tmp_path / "i")), "does not exist"),
        (("index", "--wirelog", str(spark_sample.wirelog), "--index", str(spark_sample.index),
          "--buckets", "64"), "built with 4 buckets, not 64"),
        (("index", "--wirelog", str(spark_sample.wirelog), "--index", str(tmp_path / "i"), "--interval", "x"),
         "--interval"),
        (("errors", "--index", str(tmp_path / "none")), "no index at"),
        (("errors", "--index", str(spark_sample.index), "--since", "later"), "not a time"),
    ]  # fmt: skip
    bad_rules = tmp_path / "alerts.toml"
    bad_rules.write_text("[[alerts.rule]]\nname = 'x'\n")
    cases.append(
        (("errors", "--index", str(spark_sample.index), "--alerts", str(bad_rules)), "exactly one of")
    )
    for args, message in cases:
        done = strictq(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


# ------------------------------------------------------------------------------------- admin endpoint
@pytest.fixture
async def admin_url(spark_sample: SampleIndex, tmp_path: Path) -> AsyncIterator[str]:
    service = QueueService(tmp_path / "queue")
    await service.start()
    hub = ControlHub(service)
    app = make_edge_app(service, KeyRing([ADMIN, PRODUCER, OPERATOR]), index=spark_sample.index, control=hub)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()


async def test_admin_endpoint_returns_the_cli_story(spark_sample: SampleIndex, admin_url: str) -> None:
    message_id = _failing_message(spark_sample)
    cli = strictq("search", "--index", str(spark_sample.index), "--message-id", message_id, "--json")
    assert cli.returncode == 0, cli.stderr
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        url = f"{admin_url}/admin/v1/search"
        async with http.get(
            url, params={"message_id": message_id}, headers={"X-BV-API-Key": OPERATOR.secret}
        ) as r:
            assert r.status == 200 and r.content_type == "application/json"
            body: Any = orjson.loads(await r.read())
        assert body == json.loads(cli.stdout)
        assert body["records"] == brute_force(spark_sample.wirelog, message_id)
        async with http.get(
            url, params={"message_id": message_id}, headers={"X-BV-API-Key": ADMIN.secret}
        ) as r:  # a tenant's admin: records of no tenant are not its own
            assert r.status == 200 and (await r.json())["records"] == []

        bearer = {"Authorization": f"Bearer {OPERATOR.secret}"}
        async with http.get(url, params={"message_id": message_id, "status": "5xx"}, headers=bearer) as r:
            filtered = orjson.loads(await r.read())
            assert r.status == 200 and filtered["records"]
            assert all(rec["response"]["status"] >= 500 for rec in filtered["records"])
        async with http.get(url, params={"message_id": message_id}) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "unauthorized"
        async with http.get(
            url, params={"message_id": message_id}, headers={"X-BV-API-Key": PRODUCER.secret}
        ) as r:
            assert r.status == 403
        for params in (
            {"message_id": "bad id"},
            {"message_id": "m", "since": "soon"},
            {"mesage_id": "m"},
            {},
        ):
            async with http.get(url, params=params, headers=bearer) as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_parameter", params
        async with http.get(url, params={"message_id": "absent"}, headers=bearer) as r:
            assert r.status == 200 and (await r.json())["records"] == []


async def test_admin_endpoint_without_an_index_is_404(tmp_path: Path) -> None:
    service = QueueService(tmp_path / "queue")
    await service.start()
    runner = web.AppRunner(
        make_edge_app(service, KeyRing([ADMIN]), index=tmp_path / "index", control=ControlHub(service)),
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/admin/v1/search"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.get(
                url, params={"message_id": "m-1"}, headers={"X-BV-API-Key": ADMIN.secret}
            ) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "no_index"
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()


def test_search_as_the_process_command_loads_no_numpy(spark_sample: SampleIndex) -> None:
    """`strictq search` run as the process (main() reading sys.argv) keeps pyarrow off numpy, and prints
    the same story as a caller of main() in a process with numpy."""
    message_id = spark_sample.traffic.message_ids[0]
    argv = ["strictq", "search", "--index", str(spark_sample.index), "--message-id", message_id, "--json"]
    code = (
        "import sys, io, contextlib, json\n"
        f"sys.argv = {argv!r}\n"
        "from strictq.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main()\n"
        "print(rc, sys.modules.get('numpy') is None, len(json.loads(out.getvalue())['records']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    from spark.search import Query, search

    expected = len(search(spark_sample.index, Query(message_id=message_id)).rows)
    assert expected > 0 and done.stdout.split() == ["0", "True", str(expected)]


def test_cached_search_follows_each_commit(spark_sample: SampleIndex, tmp_path: Path) -> None:
    """A server's IndexCache answers as an uncached search does, before and after a new commit of
    `_index.json` (here one dropping the message's bucket), and reuses footers in between."""
    import shutil

    from spark import layout
    from spark.buckets import bucket_of
    from spark.search import IndexCache, Query, search

    index = tmp_path / "index"
    shutil.copytree(spark_sample.index, index)
    message_id = spark_sample.traffic.message_ids[0]
    query = Query(message_id=message_id)
    cache = IndexCache()
    plain = search(index, query)
    first = search(index, query, cache=cache)
    assert plain.rows and first.rows == plain.rows
    footers = dict(cache._footers)
    assert footers and search(index, query, cache=cache).rows == plain.rows
    assert all(cache._footers[name] is footer for name, footer in footers.items())  # not parsed again
    state = layout.load_state(index)
    state.files[bucket_of(message_id, state.buckets)] = []
    layout.commit_state(index, state)
    assert search(index, query, cache=cache).rows == search(index, query).rows == []
