"""`wirelog tail` and `wirelog grep` in time order across writers (issue 14, "the first hour").

Segment names order one writer's segments, not different writers' (a name carries its writer instance's
start): a proxy started after the core names its segments later than the core's newest, though the core
wrote after it. tail must show the newest records of any writer, grep every record in time order.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from kit import FakeClock, strictq

from wirelog.layout import CLOSED, GZ, OPEN, parse_segment_name
from wirelog.reader import ReadStats, RecordFilter, merged_records, tail_records
from wirelog.record import event_record
from wirelog.writer import WireLogWriter


def _event(n: int, ts: float) -> dict[str, Any]:
    return event_record(event="fence", worker=f"w{n}", reason=f"n={n}", ts=ts)


def _states(directory: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in directory.iterdir():
        name = parse_segment_name(path.name)
        if name is not None:
            found.setdefault(name.writer, set()).add(name.state)
    return found


def stopped_server(directory: Path) -> tuple[list[float], list[float]]:
    """A core writer started first and a proxy started after it: the proxy's records are old (ts 100+),
    the core's new (ts 200+), each over several segments, all closed (the server stopped). Returns the
    ts of the core's and the proxy's records."""
    core_clock, proxy_clock = FakeClock(1_000.0), FakeClock(2_000.0)  # the proxy's segments sort later
    core = WireLogWriter(directory, "core", max_segment_bytes=400, clock=core_clock)
    proxy = WireLogWriter(directory, "proxy", max_segment_bytes=400, compress=False, clock=proxy_clock)
    proxy_ts = [100.0 + i for i in range(12)]
    core_ts = [200.0 + i for i in range(12)]
    for ts in proxy_ts:
        proxy.write(_event(int(ts), ts))
    for ts in core_ts:
        core.write(_event(int(ts), ts))
    proxy.close()
    core.close()
    return core_ts, proxy_ts


def test_tail_shows_the_newest_records_of_any_writer(tmp_path: Path) -> None:
    core_ts, _ = stopped_server(tmp_path)
    states = _states(tmp_path)
    assert states["core"] == {GZ} and states["proxy"] == {CLOSED}  # several closed segments each
    assert len(list(tmp_path.glob("core.*"))) > 2 and len(list(tmp_path.glob("proxy.*"))) > 2

    records, _ = tail_records(tmp_path, 5)
    assert [r["ts"] for r in records] == core_ts[-5:]
    records, _ = tail_records(tmp_path, 15)  # more than one writer has: the rest from the other
    assert [r["ts"] for r in records] == [109.0, 110.0, 111.0, *core_ts]
    assert tail_records(tmp_path, 0)[0] == []

    where = RecordFilter(worker="w105")
    assert [r["ts"] for r in tail_records(tmp_path, 3, where=where)[0]] == [105.0]


def test_tail_reads_few_segments_of_a_long_log(tmp_path: Path) -> None:
    stopped_server(tmp_path)
    stats = ReadStats()
    tail_records(tmp_path, 1, stats=stats)
    assert stats.files == 2  # the newest segment of each writer, not all of them


def test_tail_then_follow_sees_only_new_records(tmp_path: Path) -> None:
    stopped_server(tmp_path)
    live = WireLogWriter(tmp_path, "gateway", compress=False, fsync="always")
    try:
        live.write(_event(300, 300.0))
        records, follower = tail_records(tmp_path, 2)
        assert [r["ts"] for r in records] == [211.0, 300.0]
        live.write(_event(301, 301.0))
        live.rotate()
        live.write(_event(302, 302.0))
        assert [r["ts"] for r in follower.poll()] == [301.0, 302.0]
        assert follower.poll() == []
    finally:
        live.close()


@pytest.fixture
def interleaved(tmp_path: Path) -> Iterator[list[float]]:
    """Three writers writing in turns, with rotation: gzip, plain and open segments at once (the proxy
    still running). Yields the ts written, in order."""
    directory = tmp_path
    gateway = WireLogWriter(directory, "gateway", max_segment_bytes=350, clock=FakeClock(5_000.0))
    core = WireLogWriter(directory, "core", max_segment_bytes=350, compress=False, clock=FakeClock(1_000.0))
    # The running proxy does not compress: a background gzip of its closed segments would race the
    # file count below (gzip segments come from the gateway, closed and so done compressing).
    proxy = WireLogWriter(directory, "proxy", max_segment_bytes=350, compress=False, clock=FakeClock(3_000.0))
    written: list[float] = []
    ts = 100.0
    for turn in range(30):
        writer = (gateway, core, proxy)[turn % 3]
        writer.write(_event(turn, ts))
        written.append(ts)
        ts += 0.5
    gateway.close()
    core.close()
    proxy.flush()  # still open: grep reads its complete lines
    try:
        assert OPEN in _states(directory)["proxy"]
        yield written
    finally:
        proxy.close()


def test_merged_records_are_in_time_order_across_writers(tmp_path: Path, interleaved: list[float]) -> None:
    written = interleaved
    stats = ReadStats()
    got = [r["ts"] for r in merged_records(tmp_path, stats=stats)]
    assert got == written
    assert stats.files == len([p for p in tmp_path.iterdir() if parse_segment_name(p.name)])
    only = [r["ts"] for r in merged_records(tmp_path, where=RecordFilter(worker="w7"))]
    assert only == [103.5]


def test_grep_and_tail_commands_print_in_time_order(tmp_path: Path, interleaved: list[float]) -> None:
    written = interleaved

    def run(*args: str) -> list[float]:
        done = subprocess.run(
            strictq("wirelog", *args, "--dir", str(tmp_path), "--json"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return [orjson.loads(line)["ts"] for line in done.stdout.splitlines()]

    assert run("grep") == written
    since = run("grep", "--kind", "event", "--since", "1970-01-01T00:01:50Z")
    assert since == [t for t in written if t >= 110]
    assert run("tail", "-n", "4") == written[-4:]
