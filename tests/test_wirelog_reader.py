"""The streaming reader: segment order, torn tails, bad lines, unknown versions, filters, follow."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import orjson
import pytest
from kit.clock import FakeClock

from wirelog import reader as reader_module
from wirelog.errors import SegmentError
from wirelog.reader import (
    Follower,
    ReadStats,
    RecordFilter,
    parse_status,
    read_records,
    segments,
    tail_records,
)
from wirelog.record import encode, http_record, http_request, http_response
from wirelog.writer import WireLogWriter, compress_segment

WALL = 1_795_330_000.0  # where the fake clock starts: a realistic epoch second for segment names


def seg(writer: str, stamp_second: int, seq: int, state: str) -> str:
    return f"{writer}.20261122T1000{stamp_second:02d}000000Z.{seq:06d}{state}"


def line(**fields: object) -> bytes:
    return encode({"v": 1, "kind": "log", **fields})


def test_segments_in_time_order_one_file_per_segment(tmp_path: Path) -> None:
    layout = {
        seg("proxy-1", 5, 1, ".jsonl.gz"): b"",
        seg("proxy-0", 1, 2, ".jsonl"): b"",
        seg("proxy-0", 1, 2, ".jsonl.gz"): b"",  # mid-compression: both exist, the gzip wins
        seg("proxy-0", 1, 1, ".jsonl.gz"): b"",
        seg("proxy-0", 1, 3, ".jsonl.open"): b"",
        seg("proxy-0", 1, 3, ".jsonl.gz.tmp"): b"",  # never listed
        seg("gateway", 3, 1, ".jsonl.open"): b"",
        "README.txt": b"",
        ".proxy-0.lock": b"",
    }
    for name, data in layout.items():
        (tmp_path / name).write_bytes(data)
    assert [p.name for p in segments(tmp_path)] == [
        seg("proxy-0", 1, 1, ".jsonl.gz"),
        seg("proxy-0", 1, 2, ".jsonl.gz"),
        seg("proxy-0", 1, 3, ".jsonl.open"),
        seg("gateway", 3, 1, ".jsonl.open"),
        seg("proxy-1", 5, 1, ".jsonl.gz"),
    ]
    assert [p.name for p in segments(tmp_path, include_open=False)] == [
        seg("proxy-0", 1, 1, ".jsonl.gz"),
        seg("proxy-0", 1, 2, ".jsonl.gz"),
        seg("proxy-1", 5, 1, ".jsonl.gz"),
    ]
    with pytest.raises(SegmentError):
        segments(tmp_path / "missing")


def test_reads_plain_gzip_and_open_segments_and_single_files(tmp_path: Path) -> None:
    (tmp_path / seg("w", 1, 1, ".jsonl.gz")).write_bytes(gzip.compress(line(n=1) + line(n=2)))
    (tmp_path / seg("w", 1, 2, ".jsonl")).write_bytes(line(n=3))
    (tmp_path / seg("w", 1, 3, ".jsonl.open")).write_bytes(line(n=4))
    stats = ReadStats()
    assert [r["n"] for r in read_records(tmp_path, stats=stats)] == [1, 2, 3, 4]
    assert (stats.files, stats.records, stats.problems) == (3, 4, 0)
    assert [r["n"] for r in read_records(tmp_path, include_open=False)] == [1, 2, 3]
    assert [r["n"] for r in read_records(tmp_path / seg("w", 1, 1, ".jsonl.gz"))] == [1, 2]
    other = tmp_path / "export.bin"  # any file: gzip recognised by its magic bytes, not its name
    other.write_bytes(gzip.compress(line(n=9)))
    assert [r["n"] for r in read_records(other)] == [9]
    with pytest.raises(SegmentError):
        list(read_records(tmp_path / "nope.jsonl"))


def test_streams_in_chunks_across_line_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "CHUNK", 7)  # every line spans several reads
    records = b"".join(line(n=i, pad="z" * i) for i in range(30))
    (tmp_path / seg("w", 1, 1, ".jsonl.gz")).write_bytes(gzip.compress(records))
    (tmp_path / seg("w", 1, 2, ".jsonl")).write_bytes(records)
    stats = ReadStats()
    assert [r["n"] for r in read_records(tmp_path, stats=stats)] == list(range(30)) * 2
    assert stats.problems == 0


def test_torn_last_line_of_an_open_segment_is_skipped_and_reported(tmp_path: Path) -> None:
    name = seg("w", 1, 1, ".jsonl.open")
    (tmp_path / name).write_bytes(line(n=1) + line(n=2) + b'{"v":1,"kind":"log","n":3,"pa')
    stats = ReadStats()
    assert [r["n"] for r in read_records(tmp_path, stats=stats)] == [1, 2]
    assert stats.torn_lines == 1 and stats.problems == 1
    assert name in stats.notes[0] and "torn" in stats.notes[0] and "29 bytes" in stats.notes[0]
    assert "1 torn" in stats.summary()


def test_truncated_gzip_is_read_up_to_the_tear(tmp_path: Path) -> None:
    payload = b"".join(line(n=i, pad=os.urandom(8).hex()) for i in range(2000))
    compressed = gzip.compress(payload)
    name = seg("w", 1, 1, ".jsonl.gz")
    (tmp_path / name).write_bytes(compressed[: len(compressed) // 2])
    stats = ReadStats()
    numbers = [r["n"] for r in read_records(tmp_path, stats=stats)]
    assert 0 < len(numbers) < 2000 and numbers == list(range(len(numbers)))
    assert stats.corrupt_files == 1
    assert any(name in note and "gzip" in note for note in stats.notes)


def test_bad_lines_and_unknown_versions_are_counted_not_fatal(tmp_path: Path) -> None:
    name = seg("w", 1, 1, ".jsonl")
    (tmp_path / name).write_bytes(
        line(n=1)
        + b"garbage\n"
        + b"\n"
        + b"[1,2]\n"
        + encode({"v": 2, "kind": "log", "n": 99})
        + encode({"v": 1, "kind": "log", "n": 2})
        + b"\x00\x00\x00\n"
        + line(n=3)
    )
    stats = ReadStats()
    assert [r["n"] for r in read_records(tmp_path, stats=stats)] == [1, 2, 3]
    assert (stats.bad_lines, stats.unknown_versions, stats.torn_lines) == (4, 1, 0)
    assert any("first at line 2" in note for note in stats.notes)
    assert any("unknown schema version" in note for note in stats.notes)


def test_a_segment_compressed_between_listing_and_reading_is_read_once(tmp_path: Path) -> None:
    closed = tmp_path / seg("w", 1, 1, ".jsonl")
    closed.write_bytes(line(n=1) + line(n=2))
    (listed,) = segments(tmp_path)
    compress_segment(closed)  # the writer's compression thread got there first
    stats = ReadStats()
    assert [r["n"] for r in read_records(listed, stats=stats)] == [1, 2]
    assert stats.missing_files == 0


# ------------------------------------------------------------------------------------------ filters
def http(status: int | None, **fields: object) -> dict[str, object]:
    return http_record(
        request=http_request(method="GET", url="https://api.example/x", headers=[], body=None),
        response=http_response(status=status, headers=[], body=b"") if status is not None else None,
        error=None if status is not None else "connection refused",
        **fields,  # type: ignore[arg-type]
    )


def test_record_filter_fields() -> None:
    a = {**http(502, message_id="m1", group="g1", worker="w1", queue="q"), "ts": 100.0}
    b = {**http(200, message_id="m2", group="g1", worker="w2", queue="q", action="mimic"), "ts": 200.0}
    c = {**http(None, message_id="m1"), "ts": 300.0}
    d = {"v": 1, "kind": "event", "event": "fenced", "worker": "w1", "ts": 400.0}
    records = [a, b, c, d]

    def pick(**criteria: object) -> list[dict[str, object]]:
        where = RecordFilter(**criteria)  # type: ignore[arg-type]
        return [r for r in records if where.matches(r)]

    assert pick() == records and RecordFilter().empty
    assert pick(message_id="m1") == [a, c]
    assert pick(group="g1", worker="w2") == [b]
    assert pick(status=502) == [a] and pick(status="5xx") == [a] and pick(status="2XX") == [b]
    assert pick(status="502") == [a]  # from the command line
    assert pick(since=200.0) == [b, c, d] and pick(until=200.0) == [a, b]
    assert pick(since=150.0, until=350.0) == [b, c]
    assert pick(kind="event") == [d] and pick(queue="q") == [a, b] and pick(action="mimic") == [b]
    for bad in ("6xx", "5x", "abc", 42, 1000):
        with pytest.raises(ValueError):
            RecordFilter(status=bad)
    with pytest.raises(ValueError):
        RecordFilter(kind="https")
    assert parse_status(" 503 ") == 503


def test_read_records_applies_the_filter_and_counts_matches(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "w") as writer:
        for i in range(10):
            writer.write(http(500 + i % 2, message_id=f"m{i % 3}"))
    stats = ReadStats()
    found = list(read_records(tmp_path, stats=stats, where=RecordFilter(message_id="m0", status=500)))
    assert [r["message_id"] for r in found] == ["m0", "m0"]
    assert (stats.records, stats.matched) == (10, 2)


# ------------------------------------------------------------------------------------- tail/follow
def test_tail_and_follow_across_rotation_and_compression(tmp_path: Path) -> None:
    clock = FakeClock(WALL)
    writer = WireLogWriter(tmp_path, "proxy", max_segment_bytes=400, clock=clock)

    def put(n: int) -> None:
        clock.now += 1.0
        writer.write({"kind": "log", "n": n})

    for n in range(20):
        put(n)
    writer.flush()
    last, follower = tail_records(tmp_path, 5)
    assert [r["n"] for r in last] == [15, 16, 17, 18, 19]
    assert follower.poll() == []
    for n in range(20, 23):
        put(n)
    writer.flush()
    assert [r["n"] for r in follower.poll()] == [20, 21, 22]  # from the open segment
    for n in range(23, 40):
        put(n)  # rotations: the followed segment is closed and compressed
    writer.flush()
    assert writer.wait_compressed(timeout=30)
    assert [r["n"] for r in follower.poll()] == list(range(23, 40))
    writer.close()
    assert follower.poll() == []
    assert follower.stats.problems == 0


def test_follower_from_the_start_reads_everything_once(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "a", compress=False) as a, WireLogWriter(tmp_path, "b") as b:
        a.write({"kind": "log", "n": 1})
        b.write({"kind": "log", "n": 2})
        a.flush()
        b.flush()
        follower = Follower(tmp_path)
        assert sorted(r["n"] for r in follower.poll()) == [1, 2]
        a.write({"kind": "log", "n": 3})
        a.flush()
        assert [r["n"] for r in follower.poll()] == [3]
    assert follower.poll() == []


def test_tail_with_a_filter_and_zero_lines(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "w", max_segment_bytes=300) as writer:
        for i in range(30):
            writer.write({"kind": "log", "n": i, "group": "even" if i % 2 == 0 else "odd"})
    last, _ = tail_records(tmp_path, 3, where=RecordFilter(group="odd"))
    assert [r["n"] for r in last] == [25, 27, 29]
    assert tail_records(tmp_path, 0)[0] == []
    raw = b"".join(gzip.decompress(p.read_bytes()) for p in segments(tmp_path))
    assert len(raw.splitlines()) == 30 and orjson.loads(raw.splitlines()[0])["n"] == 0
