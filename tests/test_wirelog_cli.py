"""`strictq wirelog tail|grep` as a user runs it (subprocesses), plus the time parser it uses."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from wirelog.record import http_record, http_request, http_response
from wirelog.times import TimeParseError, format_time, parse_time
from wirelog.writer import WireLogWriter

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC).timestamp()


def strictq_command() -> list[str]:
    script = Path(sys.executable).with_name("strictq")
    if script.exists():
        return [str(script)]
    found = shutil.which("strictq")
    return [found] if found else [sys.executable, "-m", "strictq"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STRICTQ_")}
    return subprocess.run(
        [*strictq_command(), "wirelog", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        cwd=ROOT,
        timeout=30,
        check=False,
    )


def call(status: int | None, ts: float, **fields: Any) -> dict[str, Any]:
    return http_record(
        request=http_request(method="GET", url="https://api.example/v1/items", headers=[], body=None),
        response=http_response(status=status, headers=[], body=b"ok") if status is not None else None,
        error=None if status is not None else "connection refused",
        latency_ms=12.5,
        ts=ts,
        **fields,
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two writers, gzip and open segments, records an hour apart ending now."""
    directory = tmp_path_factory.mktemp("wirelog")
    now = datetime.now(UTC).timestamp()
    with WireLogWriter(directory, "proxy-0", max_segment_bytes=1500) as proxy:
        for i in range(12):
            status = 502 if i % 4 == 0 else 200
            proxy.write(call(status, now - (12 - i) * 3600, message_id=f"m{i % 3}", group="g1", worker="w1"))
        proxy.write(call(None, now - 30, message_id="m9", group="g2", worker="w2"))
    gateway = WireLogWriter(directory, "gateway")
    gateway.write(
        {"kind": "delivery", "message_id": "m1", "group": "g1", "seq": 7, "receive_count": 1, "ts": now}
    )
    gateway.flush()  # left open, like a live gateway's segment
    yield directory
    gateway.close()


def test_grep_by_message_id_human_readable(logdir: Path) -> None:
    result = run("grep", "--dir", str(logdir), "--message-id", "m1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 5  # 4 calls + the delivery
    first = lines[0].split()
    assert first[1:5] == ["http", "w1", "m1", "g1"] and first[5:8] == [
        "pass",
        "GET",
        "https://api.example/v1/items",
    ]
    assert first[8:] == ["200", "12.5ms"] and first[0].endswith("Z")
    assert "seq=7" in lines[-1] and "delivery" in lines[-1]
    assert result.stderr == ""


def test_grep_json_and_status_filters(logdir: Path) -> None:
    result = run("grep", "--dir", str(logdir), "--status", "5xx", "--json")
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0 and len(records) == 3
    assert {r["response"]["status"] for r in records} == {502} and all(r["v"] == 1 for r in records)
    exact = run("grep", "--dir", str(logdir), "--status", "200", "--group", "g1", "--kind", "http")
    assert len(exact.stdout.splitlines()) == 9
    error = run("grep", "--dir", str(logdir), "--worker", "w2")
    assert "ERR" in error.stdout and "connection refused" in error.stdout


def test_grep_time_windows(logdir: Path) -> None:
    recent = run("grep", "--dir", str(logdir), "--since", "90m", "--json")
    assert [orjson.loads(line)["kind"] for line in recent.stdout.splitlines()] == ["http", "http", "delivery"]
    start = datetime.fromtimestamp(datetime.now(UTC).timestamp() - 5.5 * 3600, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    window = run("grep", "--dir", str(logdir), "--since", start, "--until", "2h", "--kind", "http")
    assert window.returncode == 0 and len(window.stdout.splitlines()) == 4  # 5h, 4h, 3h and 2h ago


def test_grep_no_match_exits_1(logdir: Path) -> None:
    result = run("grep", "--dir", str(logdir), "--message-id", "nope")
    assert (result.returncode, result.stdout) == (1, "")


@pytest.mark.parametrize(
    "args,message",
    [
        (["grep", "--since", "yesterday-ish"], "not a time"),
        (["grep", "--until", "2026-13-45"], "not a time"),
        (["grep", "--status", "6xx"], "--status"),
        (["grep", "--kind", "https"], "--kind"),
        (["grep", "--action", "allow"], "--action"),
        (["grep", "--since", "1h", "--until", "2h"], "after --until"),
        (["tail", "-n", "-1"], "-n"),
    ],
)
def test_usage_errors_exit_2_without_traceback(logdir: Path, args: list[str], message: str) -> None:
    result = run(*args, "--dir", str(logdir))
    assert result.returncode == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr


def test_missing_directory_exits_2(tmp_path: Path) -> None:
    for args in (["grep", "--dir", str(tmp_path / "none")], ["tail"]):
        result = run(*args, env={"STRICTQ_WIRELOG_DIR": str(tmp_path / "absent")})
        assert result.returncode == 2 and "does not exist" in result.stderr
        assert "Traceback" not in result.stderr
    bare = run()
    assert bare.returncode == 2 and "tail" in bare.stdout and "grep" in bare.stdout


def test_tail_last_records_by_time_and_env_dir(logdir: Path) -> None:
    result = run("tail", "-n", "3", "--json", env={"STRICTQ_WIRELOG_DIR": str(logdir)})
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0, result.stderr
    assert [r["kind"] for r in records] == ["http", "http", "delivery"]
    assert [r["writer"] for r in records] == ["proxy-0", "proxy-0", "gateway"]
    assert records[0]["ts"] < records[1]["ts"] < records[2]["ts"]


def test_torn_lines_are_reported_on_stderr(tmp_path: Path) -> None:
    name = "w.20261122T100000000000Z.000001.jsonl.open"
    good = orjson.dumps({"v": 1, "kind": "log", "outcome": "ok", "ts": NOW}) + b"\n"
    (tmp_path / name).write_bytes(
        good + b"not json\n" + orjson.dumps({"v": 9, "kind": "log"}) + b"\n" + b'{"v":1,'
    )
    result = run("grep", "--dir", str(tmp_path))
    assert result.returncode == 0 and "outcome=ok" in result.stdout
    assert "1 torn last line" in result.stderr and "1 unreadable line" in result.stderr
    assert "unknown schema version" in result.stderr and name in result.stderr


def test_tail_follow_prints_new_records(tmp_path: Path) -> None:
    writer = WireLogWriter(tmp_path, "proxy", max_segment_bytes=600)
    writer.write({"kind": "event", "event": "before"})
    writer.flush()
    proc = subprocess.Popen(
        [*strictq_command(), "wirelog", "tail", "--dir", str(tmp_path), "-n", "5", "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert orjson.loads(lines.get(timeout=15))["event"] == "before"
        for i in range(12):  # enough to rotate and compress the followed segment
            writer.write({"kind": "event", "event": f"after-{i}"})
        writer.flush()
        seen = [orjson.loads(lines.get(timeout=15))["event"] for _ in range(12)]
        assert seen == [f"after-{i}" for i in range(12)]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        writer.close()
    assert proc.returncode == 0
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    proc.stderr.close()


def test_wirelog_commands_import_no_heavy_packages(logdir: Path) -> None:
    code = (
        "import argparse, sys\n"
        "from wirelog.cli import register\n"
        "parser = argparse.ArgumentParser(); register(parser.add_subparsers())\n"
        f"args = parser.parse_args(['wirelog', 'grep', '--dir', {str(logdir)!r}, '--json'])\n"
        "assert args.handler(args) == 0\n"
        "heavy = [m for m in ('mitmproxy', 'aiohttp', 'pyspark', 'asyncio') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


# -------------------------------------------------------------------------------------------- times
def test_parse_time_iso_and_relative() -> None:
    assert parse_time("2026-11-22T10:00:00Z") == NOW
    assert parse_time("2026-11-22T11:00:00+01:00") == NOW
    assert parse_time("2026-11-22T10:00:00") == NOW  # no zone: UTC
    assert parse_time("2026-11-22") == NOW - 10 * 3600
    assert parse_time("15m", now=NOW) == NOW - 900
    assert parse_time("2h", now=NOW) == NOW - 7200
    assert parse_time("7d ago", now=NOW) == NOW - 7 * 86400
    assert parse_time("1.5H", now=NOW) == NOW - 5400
    assert parse_time("30s", now=NOW) == NOW - 30 and parse_time("1w", now=NOW) == NOW - 604800
    for bad in ("", "15", "15x", "m15", "soon", "2026-11-31T00:00:00Z"):
        with pytest.raises(TimeParseError):
            parse_time(bad, now=NOW)


def test_format_time() -> None:
    assert format_time(NOW + 0.1234) == "2026-11-22T10:00:00.123Z"
    assert format_time(None) == "-"
