"""WireLogWriter on real files: rotation, compression, fsync policies, crash recovery (also by SIGKILL)."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from kit.clock import FakeClock

from wirelog import writer as writer_module
from wirelog.errors import RecordError, SegmentError
from wirelog.layout import parse_segment_name
from wirelog.reader import ReadStats, read_records, segments
from wirelog.record import event_record, log_record
from wirelog.writer import WireLogWriter, compress_segment

ROOT = Path(__file__).resolve().parent.parent


WALL = 1_795_330_000.0  # where the fake clock starts: a realistic epoch second for segment names


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def read_all(directory: Path) -> tuple[list[dict[str, object]], ReadStats]:
    stats = ReadStats()
    return list(read_records(directory, stats=stats)), stats


def test_write_fills_schema_fields_and_returns_unique_ids(tmp_path: Path) -> None:
    clock = FakeClock(WALL)
    with WireLogWriter(tmp_path, "gateway", clock=clock) as writer:
        first = writer.write(event_record(event="started"))
        second = writer.write({"kind": "log", "outcome": "ok", "ts": 5.0})
        assert first != second and first.startswith(f"gateway-{writer.instance}-")
    (a, b), stats = read_all(tmp_path)
    assert stats.problems == 0
    assert (a["v"], a["kind"], a["id"], a["writer"], a["ts"]) == (1, "event", first, "gateway", clock.now)
    assert (b["id"], b["ts"], b["outcome"]) == (second, 5.0, "ok")  # a given ts is kept
    assert list(a)[:5] == ["v", "kind", "id", "ts", "writer"]


@pytest.mark.parametrize(
    "record",
    [
        {"kind": "nope"},
        {"outcome": "no kind"},
        {"kind": "log", "v": 2},
        {"kind": "log", "id": "mine"},
        {"kind": "log", "writer": "someone-else"},
        {"kind": "log", "bad": object()},
    ],
)
def test_invalid_records_are_refused(tmp_path: Path, record: dict[str, object]) -> None:
    with WireLogWriter(tmp_path, "w") as writer:
        with pytest.raises(RecordError):
            writer.write(record)
        writer.write({"kind": "log"})  # the writer is still usable
    records, _ = read_all(tmp_path)
    assert len(records) == 1 and records[0]["id"].endswith("-1")  # type: ignore[union-attr]


def test_bad_names_and_options(tmp_path: Path) -> None:
    for name in ("", "a.b", "a/b", "x" * 65, "sp ace"):
        with pytest.raises(ValueError):
            WireLogWriter(tmp_path, name)
    with pytest.raises(ValueError):
        WireLogWriter(tmp_path, "w", fsync="sometimes")  # type: ignore[arg-type]
    writer = WireLogWriter(tmp_path, "w")
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(SegmentError):
        writer.write({"kind": "log"})


def test_rotation_by_size_and_gzip_segments(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "proxy-0", max_segment_bytes=1000) as writer:
        ids = [writer.write(log_record(outcome="ok", reason="r" * 50, message_id=f"m{i}")) for i in range(40)]
    names = files(tmp_path)
    assert len(names) > 3 and all(name.endswith(".jsonl.gz") for name in names)
    assert writer.stats.segments_closed == writer.stats.segments_compressed == len(names)
    seen: list[str] = []
    for name in names:  # the stdlib gzip module (and so Spark, zcat) reads them
        data = gzip.decompress((tmp_path / name).read_bytes())
        assert 0 < len(data) <= 1000
        seen += [orjson.loads(line)["id"] for line in data.splitlines()]
    assert seen == ids  # in order, nothing lost or repeated across segments
    assert [r["id"] for r in read_all(tmp_path)[0]] == ids


def test_a_record_larger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "w", max_segment_bytes=100, compress=False) as writer:
        writer.write({"kind": "log", "reason": "x" * 500})
        writer.write({"kind": "log"})
    assert len(files(tmp_path)) == 2
    assert len(read_all(tmp_path)[0]) == 2


def test_rotation_by_age_on_tick_and_on_write(tmp_path: Path) -> None:
    clock = FakeClock(WALL)
    writer = WireLogWriter(tmp_path, "w", max_segment_age=300.0, compress=False, clock=clock)
    writer.tick()  # nothing written: no empty segments
    assert files(tmp_path) == []
    writer.write({"kind": "log", "n": 1})
    clock.now += 299.0
    writer.tick()
    assert writer.stats.segments_closed == 0
    clock.now += 1.0
    writer.tick()  # the proxy's timer: an idle segment still closes on time
    assert writer.stats.segments_closed == 1 and writer.current_segment is None
    writer.write({"kind": "log", "n": 2})
    clock.now += 300.0
    writer.write({"kind": "log", "n": 3})  # age also checked on write: n=3 starts a new segment
    writer.close()
    names = files(tmp_path)
    assert len(names) == 3 and all(name.endswith(".jsonl") for name in names)
    assert [r["n"] for r in read_all(tmp_path)[0]] == [1, 2, 3]


def test_fsync_always_syncs_every_record(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "w", fsync="always", compress=False) as writer:
        for _ in range(5):
            writer.write({"kind": "log"})
        assert writer.stats.fsyncs == 5


def test_fsync_interval_syncs_at_most_once_per_interval(tmp_path: Path) -> None:
    clock = FakeClock(WALL)
    writer = WireLogWriter(tmp_path, "w", fsync="interval", fsync_interval=1.0, compress=False, clock=clock)
    for _ in range(10):
        writer.write({"kind": "log"})
    assert writer.stats.fsyncs == 0
    clock.now += 1.0
    writer.write({"kind": "log"})
    assert writer.stats.fsyncs == 1
    writer.write({"kind": "log"})
    clock.now += 0.5
    writer.tick()
    assert writer.stats.fsyncs == 1
    clock.now += 0.5
    writer.tick()  # an idle tail is synced by the timer, not left until the next write
    assert writer.stats.fsyncs == 2
    writer.close()


def test_fsync_never_and_flush_visibility(tmp_path: Path) -> None:
    writer = WireLogWriter(tmp_path, "w", fsync="never", compress=False, buffer_bytes=1 << 20)
    writer.write({"kind": "log", "n": 1})
    assert read_all(tmp_path)[0] == []  # still in the writer's buffer
    writer.flush()  # handed to the OS: readers (and a process crash) see it
    assert [r["n"] for r in read_all(tmp_path)[0]] == [1]
    writer.tick()
    assert writer.stats.fsyncs == 0
    writer.close()


def test_counters_for_metrics(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path, "w", max_segment_bytes=200) as writer:
        for _ in range(10):
            writer.write({"kind": "log", "reason": "x" * 40})
    counters = writer.counters()
    assert counters["records"] == 10 and counters["bytes"] > 400
    assert counters["segments_closed"] == counters["segments_compressed"] >= 2
    assert counters["segments_pending_compression"] == 0


def test_ids_stay_unique_across_restarts_even_with_a_stuck_clock(tmp_path: Path) -> None:
    clock = FakeClock(WALL)
    ids: list[str] = []
    instances = set()
    for _ in range(3):
        with WireLogWriter(tmp_path, "proxy", clock=clock, compress=False) as writer:
            instances.add(writer.instance)
            ids += [writer.write({"kind": "log"}) for _ in range(3)]
    assert len(instances) == 3 and len(set(ids)) == 9
    assert [r["id"] for r in read_all(tmp_path)[0]] == ids  # segments list in start order


def test_one_live_writer_per_name(tmp_path: Path) -> None:
    first = WireLogWriter(tmp_path, "proxy-0")
    with pytest.raises(SegmentError, match="in use"):
        WireLogWriter(tmp_path, "proxy-0")
    other = WireLogWriter(tmp_path, "proxy-1")  # another name is fine
    first.write({"kind": "log"})
    other.write({"kind": "log"})
    first.close()
    other.close()
    WireLogWriter(tmp_path, "proxy-0").close()  # free again once closed
    assert len(read_all(tmp_path)[0]) == 2


# --------------------------------------------------------------------------------------- recovery
def crashed_copy(source: Path, target: Path) -> Path:
    """The files a writer left, copied elsewhere as if its process had died (no close, no lock)."""
    target.mkdir()
    for path in source.iterdir():
        if not path.name.startswith("."):
            shutil.copy2(path, target / path.name)
    (open_segment,) = target.glob("*.jsonl.open")
    return open_segment


def test_recovery_truncates_a_torn_tail_and_compresses(tmp_path: Path) -> None:
    live = WireLogWriter(tmp_path / "live", "proxy", fsync="always")
    ids = [live.write(log_record(outcome="ok", message_id=f"m{i}")) for i in range(20)]
    open_segment = crashed_copy(tmp_path / "live", tmp_path / "crashed")
    size = open_segment.stat().st_size
    os.truncate(open_segment, size - 17)  # the last record was being written when the power went
    data = open_segment.read_bytes()
    torn_bytes = len(data) - (data.rfind(b"\n") + 1)
    assert torn_bytes > 0

    stats = ReadStats()  # a reader before recovery: the torn line is skipped and reported
    assert [r["id"] for r in read_records(tmp_path / "crashed", stats=stats)] == ids[:-1]
    assert stats.torn_lines == 1 and open_segment.name in stats.notes[0]

    with WireLogWriter(tmp_path / "crashed", "proxy") as successor:
        assert successor.stats.recovered_segments == 1
        assert successor.stats.recovered_torn_lines == 1
        assert successor.stats.recovered_torn_bytes == torn_bytes
        more = successor.write({"kind": "log", "outcome": "after restart"})
    records, stats = read_all(tmp_path / "crashed")
    assert stats.problems == 0
    assert [r["id"] for r in records] == [*ids[:-1], more]  # earlier records intact, no duplicates
    assert all(name.endswith(".jsonl.gz") for name in files(tmp_path / "crashed"))
    live.close()


def test_recovery_tidies_every_crash_state(tmp_path: Path) -> None:
    """One segment per crash point of close-and-compress: each is recovered to exactly one copy."""
    source = tmp_path / "source"
    with WireLogWriter(source, "gw", max_segment_bytes=150, compress=False) as writer:
        ids = [writer.write({"kind": "log", "reason": "y" * 60}) for _ in range(4)]
    plain = sorted(source.glob("*.jsonl"))
    assert len(plain) == 4
    # 1: closed, compression not started. 2: compression half-done (.gz.tmp) -> tmp removed, redone.
    (plain[1].parent / (plain[1].name + ".gz.tmp")).write_bytes(b"\x1f\x8b half a gzip")
    # 3: compressed and renamed, the plain copy not yet removed.
    shutil.copy(plain[2], plain[2].with_name(plain[2].name + ".tmp-copy"))
    compress_segment(plain[2])
    shutil.move(plain[2].with_name(plain[2].name + ".tmp-copy"), plain[2])
    # 4: still open (crashed while writing, no torn line).
    plain[3].rename(plain[3].with_name(plain[3].name + ".open"))

    stats = ReadStats()
    assert [r["id"] for r in read_records(source, stats=stats)] == ids  # readable mid-crash, no dupes
    assert stats.problems == 0

    with WireLogWriter(source, "gw") as successor:
        assert successor.stats.stale_tmp_removed == 1
        assert successor.stats.recovered_segments == 1
        assert successor.wait_compressed(timeout=30)
    names = files(source)
    assert len(names) == 4 and all(name.endswith(".jsonl.gz") for name in names), names
    assert [r["id"] for r in read_all(source)[0]] == ids


def test_recovery_leaves_other_writers_alone(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path / "a", "proxy-0", fsync="always") as _:
        pass
    other = WireLogWriter(tmp_path / "live", "proxy-1", fsync="always")
    other.write({"kind": "log"})
    (open_segment,) = (tmp_path / "live").glob("*.open")
    with WireLogWriter(tmp_path / "live", "proxy-0") as mine:
        assert mine.stats.recovered_segments == 0
    assert open_segment.exists()  # proxy-1's live segment is untouched
    other.close()


def test_an_empty_torn_segment_is_removed(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    name = "w.20261122T100000000000Z.000001.jsonl.open"
    (directory / name).write_bytes(b'{"v":1,"kind":"lo')  # died inside the very first record
    with WireLogWriter(directory, "w") as writer:
        assert writer.stats.recovered_torn_lines == 1
        assert writer.instance > "20261122T100000000000Z"
    assert files(directory) == []


def test_failed_compression_keeps_the_plain_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(closed: Path, *, level: int = 6) -> Path:
        tmp = closed.with_name(closed.name + ".gz.tmp")
        tmp.write_bytes(b"partial")
        tmp.unlink()
        raise OSError("disk full")

    monkeypatch.setattr(writer_module, "compress_segment", broken)
    with WireLogWriter(tmp_path, "w") as writer:
        writer.write({"kind": "log"})
    assert writer.stats.compress_errors == 1
    (name,) = files(tmp_path)
    assert name.endswith(".jsonl") and len(read_all(tmp_path)[0]) == 1
    monkeypatch.undo()
    with WireLogWriter(tmp_path, "w") as retry:  # the next start compresses it
        assert retry.wait_compressed(timeout=30)
    assert files(tmp_path)[0].endswith(".jsonl.gz")


def test_compress_segment_is_atomic(tmp_path: Path) -> None:
    closed = tmp_path / "w.20261122T100000000000Z.000001.jsonl"
    closed.write_bytes(b'{"v":1,"kind":"log"}\n' * 1000)
    final = compress_segment(closed)
    assert final.name.endswith(".jsonl.gz") and not closed.exists()
    assert gzip.decompress(final.read_bytes()) == b'{"v":1,"kind":"log"}\n' * 1000
    assert not list(tmp_path.glob("*.tmp"))
    parsed = parse_segment_name(final.name)
    assert parsed is not None and parsed.seq == 1 and parsed.writer == "w"


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from wirelog.writer import WireLogWriter

    writer = WireLogWriter(Path(sys.argv[1]), "victim", fsync="always", max_segment_bytes=4096)
    for i in range(100_000):
        record_id = writer.write({"kind": "log", "outcome": "ok", "n": i, "pad": "p" * (i % 97)})
        print(record_id, flush=True)  # only after the record is fsynced
    """
)


@pytest.mark.crash
def test_sigkill_loses_nothing_that_was_synced(tmp_path: Path) -> None:
    directory = tmp_path / "wirelog"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    acknowledged: list[str] = []
    try:
        while len(acknowledged) < 300:
            line = proc.stdout.readline()
            assert line, "the child writer died early"
            acknowledged.append(line.decode().strip())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # The child ran on while we read: every id it printed before the kill was fsynced too.
        acknowledged += [line.strip() for line in proc.stdout.read().decode().splitlines() if line.strip()]
        proc.stdout.close()
    # The victim rotates every 4 KiB: the kill may land between closing one segment and opening the next,
    # when no segment is open (seen under load); otherwise exactly the open one is recovered.
    left_open = len(list(directory.glob("*.jsonl.open")))
    assert left_open <= 1
    with WireLogWriter(directory, "victim") as successor:
        assert successor.stats.recovered_segments == left_open
        after = successor.write({"kind": "event", "event": "restarted"})
    stats = ReadStats()
    ids = [r["id"] for r in read_records(directory, stats=stats)]
    assert stats.problems == 0
    assert ids[: len(acknowledged)] == acknowledged  # every acknowledged record, in order
    assert len(ids) == len(set(ids))
    assert ids[-1] == after
    assert len(ids) - 1 - len(acknowledged) <= 1  # at most the record in flight at the kill
    assert len(segments(directory)) > 2 and all(p.name.endswith(".gz") for p in segments(directory))
