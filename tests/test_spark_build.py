"""Building the index: incremental runs, crash points (in-process and a killed real process), skipped
lines reported, compaction bounding files per bucket, and --follow."""

from __future__ import annotations

import gzip
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kit import until_sync
from spark_support import SMALL_ROW_GROUPS, brute_force, write_traffic

from spark import layout
from spark.cli import _report_skips
from spark.compact import run_compact
from spark.index import CRASH_ENV, run_index
from spark.sample import SampleSpec
from spark.search import Query, search
from spark.story import story_json
from wirelog.reader import ReadStats, read_records

ROOT = Path(__file__).resolve().parent.parent
BUCKETS = 4


class Crash(Exception):
    pass


def _index(spark: Any, wirelog: Path, index: Path, **options: Any) -> Any:
    return run_index(spark, wirelog, index, buckets=BUCKETS, row_group_bytes=SMALL_ROW_GROUPS, **options)


def assert_index_matches_segments(wirelog: Path, index: Path, sample_ids: int = 20) -> None:
    """No duplicates, no gaps: every record id exactly once, and lookups equal the brute-force scan."""
    import pyarrow.parquet as pq

    expected = {r["id"] for r in read_records(wirelog, include_open=False)}
    state = layout.load_state(index)
    ids: list[str] = []
    for path in layout.all_files(index, state):
        ids += pq.read_table(path, columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)), "duplicate records in the index"
    assert set(ids) == expected, "records missing from (or foreign to) the index"
    assert state.records == len(ids)
    on_disk = {p.name for d in (index / layout.DATA_DIR).iterdir() for p in d.iterdir()}
    assert on_disk == {n for names in state.files.values() for n in names}, "unreferenced files left behind"
    messages = sorted({r["message_id"] for r in read_records(wirelog, include_open=False) if r["message_id"]})
    for message_id in messages[:: max(1, len(messages) // sample_ids)]:
        got = story_json(search(index, Query(message_id=message_id)))["records"]
        assert got == brute_force(wirelog, message_id)


def test_incremental_runs_index_only_new_segments(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "CONSOLIDATE_AFTER", 2)  # merge manifests early, to test that too
    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    write_traffic(wirelog, SampleSpec(messages=120, seed=1))
    first = _index(spark, wirelog, index)
    assert len(first.batches) == 1 and first.already_indexed == 0
    segments_before = first.batches[0].segments
    write_traffic(wirelog, SampleSpec(messages=80, seed=2, start=1_795_345_000.0))  # new writer instances
    second = _index(spark, wirelog, index)
    assert second.already_indexed == segments_before
    assert len(second.batches) == 1 and second.batches[0].segments > 0
    assert second.records == sum(1 for _ in read_records(wirelog, include_open=False)) - first.records
    third = _index(spark, wirelog, index)
    assert third.batches == [] and third.records == 0
    assert_index_matches_segments(wirelog, index)
    # The third run merged batches 1-2 into upto-00000002.json; a fourth still finds nothing new.
    assert (index / layout.MANIFEST_DIR / "upto-00000002.json").exists()
    assert layout.committed_manifests(index, layout.load_state(index)) == []
    assert _index(spark, wirelog, index).batches == []
    write_traffic(wirelog, SampleSpec(messages=20, seed=12, start=1_795_346_000.0))
    assert len(_index(spark, wirelog, index).batches) == 1
    assert [m["batch"] for m in layout.committed_manifests(index, layout.load_state(index))] == [3]
    assert_index_matches_segments(wirelog, index)


def test_a_run_failing_at_any_point_is_redone_without_duplicates_or_gaps(spark: Any, tmp_path: Path) -> None:
    wirelog = tmp_path / "wirelog"
    write_traffic(wirelog, SampleSpec(messages=150, seed=3))
    for point in ("before-write", "after-write", "after-move", "after-manifest", "after-commit"):
        index = tmp_path / f"index-{point}"

        def fault(where: str, batch: int, point: str = point) -> None:
            if where == point and batch == 2:
                raise Crash(point)

        with pytest.raises(Crash):
            _index(spark, wirelog, index, max_batch_segments=4, fault=fault)
        state = layout.load_state(index)
        assert state.last_batch == (2 if point == "after-commit" else 1), point
        _index(spark, wirelog, index, max_batch_segments=4)
        assert_index_matches_segments(wirelog, index, sample_ids=5)


def _start_index_process(wirelog: Path, index: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "strictq", "index", "--wirelog", str(wirelog), "--index", str(index)),
            *("--buckets", str(BUCKETS), "--batch-segments", "3", "--driver-memory", "1g"),
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.crash
@pytest.mark.timeout(360)  # several JVM starts: slow when the suite loads the machine
def test_killed_index_processes_then_rerun_leave_no_duplicates_or_gaps(tmp_path: Path) -> None:
    """Every run here is a real `strictq index` process (the rerun too), so this test needs no in-process
    SparkSession and runs beside the session's group instead of after it."""
    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    write_traffic(wirelog, SampleSpec(messages=150, seed=4))

    # 1. Killed from outside with SIGKILL while Spark is writing batch 2.
    proc = _start_index_process(wirelog, index, {})
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    assert proc.stderr is not None
    threading.Thread(target=lambda: [lines.put(raw.decode()) for raw in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + 90
    seen = ""
    try:
        while "indexing batch 2" not in seen:
            assert time.monotonic() < deadline, f"no batch 2 in time; stderr so far:\n{seen}"
            try:
                seen += lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, f"exited early ({proc.returncode}):\n{seen}"
        time.sleep(0.05)  # printed just before the batch starts: batch 2 is being written, never committed
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert layout.load_state(index).last_batch == 1

    # 2. Killed (by itself, SIGKILL) after moving batch 3's files but before committing it.
    proc = _start_index_process(wirelog, index, {CRASH_ENV: "after-move:3"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert b"crashing at after-move of batch 3" in err
    state = layout.load_state(index)
    assert state.last_batch == 2
    leftovers = {p.name for d in (index / layout.DATA_DIR).iterdir() for p in d.iterdir()}
    assert any(name.startswith("b00000003-") for name in leftovers)  # moved but never committed
    # `strictq index` (its JVM too) writes under a umask of at least 027: nothing for other users.
    open_to_others = [p for p in index.rglob("*") if p.stat().st_mode & 0o007]
    assert not open_to_others, [(str(p), oct(p.stat().st_mode)) for p in open_to_others]

    # 3. A rerun removes batch 3's moved files and indexes the rest once.
    proc = _start_index_process(wirelog, index, {})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"leftover(s) of an interrupted run" in err, err.decode()[-2000:]
    assert_index_matches_segments(wirelog, index)
    # A quiet Spark start (issue 14): one line before the JVM starts, then strictq's lines only; none of
    # Spark's banner, log-level advice, JVM incubator warning or WARN lines.
    text = err.decode()
    said = text.splitlines()
    assert said[0] == "strictq: index: starting Spark (local[2]) ...", text[-2000:]
    assert all(line.startswith("strictq: index: ") for line in said), text[-2000:]
    for noise in ("Setting default log level", "setLogLevel", "incubator", "WARN"):
        assert noise not in text


def test_bad_lines_unknown_versions_and_truncated_gzip_are_skipped_and_reported(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    wirelog.mkdir()
    good = [
        orjson.dumps(
            {"v": 1, "kind": "event", "id": f"x-{i}", "ts": 1.0 + i, "writer": "x", "message_id": f"m-{i}"}
        )
        for i in range(30)
    ]
    future = orjson.dumps({"v": 2, "kind": "http", "id": "x-future", "ts": 5.0, "message_id": "m-1"})
    lines = [
        *good[:10],
        b"not json at all",
        b"[1, 2]",
        b"",
        future,
        b'{"v": "1", "kind": "log"}',
        *good[10:20],
    ]
    plain = wirelog / "hand.20261122T100000000000Z.000001.jsonl"
    plain.write_bytes(b"\n".join(lines) + b'\n{"v": 1, "kind": "http", "id": "torn"')  # torn last line
    damaged = gzip.compress(b"\n".join(good[20:]) + b"\n" + b"".join(good) * 200)
    (wirelog / "hand.20261122T100000000000Z.000002.jsonl.gz").write_bytes(damaged[: len(damaged) // 2])

    salvage = ReadStats()
    salvaged = sum(
        1 for _ in read_records(wirelog / "hand.20261122T100000000000Z.000002.jsonl.gz", stats=salvage)
    )
    assert salvage.corrupt_files == 1 and salvaged > 0

    report = _index(spark, wirelog, index)
    batch = report.batches[0]
    # not JSON, an array, an empty line, `v` as a string and the torn last line; plus the line the gzip
    # damage cut in two, if it did
    assert batch.bad_lines == 5 + salvage.torn_lines
    assert batch.unknown_versions == 1
    assert batch.salvaged_segments == 1
    assert any("gzip stream ends early" in note for note in batch.notes)
    assert any("hand.20261122T100000000000Z.000001: skipped 5 line(s)" in note for note in batch.notes)
    assert batch.records == 20 + salvaged
    assert layout.load_state(index).records == batch.records
    _report_skips(report)
    err = capsys.readouterr().err
    assert (
        f"skipped {5 + salvage.torn_lines} unreadable line(s), 1 record(s) of an unknown schema version"
        in err
    )
    assert "truncated/corrupt gzip segment(s)" in err
    manifest = layout.committed_manifests(index, layout.load_state(index))[0]
    assert (
        manifest["bad_lines"] == batch.bad_lines and manifest["unknown_versions"] == 1 and manifest["notes"]
    )


def test_compaction_bounds_files_per_bucket(spark: Any, tmp_path: Path) -> None:
    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    write_traffic(wirelog, SampleSpec(messages=150, seed=6))
    _index(spark, wirelog, index, max_batch_segments=2)
    before = layout.load_state(index)
    assert before.max_files_per_bucket() >= 4  # one file per bucket per batch

    class Stop(Exception):
        pass

    def fault(where: str, generation: int) -> None:
        if where == "after-commit":
            raise Stop  # old files not deleted yet: the next writer removes them

    with pytest.raises(Stop):
        run_compact(spark, index, fault=fault, row_group_bytes=SMALL_ROW_GROUPS)
    after = layout.load_state(index)
    assert after.max_files_per_bucket() == 1 and after.generation == 1
    assert after.records == before.records
    removed = layout.remove_orphans(index, after)
    assert len([r for r in removed if r.startswith("data/")]) == before.file_count()
    assert_index_matches_segments(wirelog, index)

    write_traffic(wirelog, SampleSpec(messages=60, seed=7, start=1_795_346_000.0))
    _index(spark, wirelog, index, max_batch_segments=1)
    grown = layout.load_state(index)
    assert grown.max_files_per_bucket() > 2
    report = run_compact(spark, index, min_files=2, row_group_bytes=SMALL_ROW_GROUPS)
    assert report.files_after <= len(report.buckets)
    assert layout.load_state(index).max_files_per_bucket() == 1
    assert_index_matches_segments(wirelog, index)
    assert run_compact(spark, index).buckets == []  # nothing left to do


def test_follow_indexes_segments_as_they_close(spark: Any, tmp_path: Path) -> None:
    from spark.follow import run_follow

    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    write_traffic(wirelog, SampleSpec(messages=40, seed=8))
    stop = threading.Event()
    batches: list[int] = []
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            run_follow(
                spark, wirelog, index, interval="1 second", buckets=BUCKETS, stop=stop,
                on_batch=lambda batch_id, report: batches.append(batch_id),
            )  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        _wait(
            lambda: index.joinpath(layout.STATE_FILE).exists() and layout.load_state(index).records > 0,
            errors,
        )
        first = layout.load_state(index).records
        with pytest.raises(layout.IndexBusy):  # follow holds the writer lock
            _index(spark, wirelog, index)
        write_traffic(wirelog, SampleSpec(messages=30, seed=9, start=1_795_347_000.0))
        total = sum(1 for _ in read_records(wirelog, include_open=False))
        _wait(lambda: layout.load_state(index).records == total, errors)
        assert total > first
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and not errors
    assert len(batches) >= 2
    assert_index_matches_segments(wirelog, index)


def _wait(condition: Any, errors: list[BaseException], timeout: float = 90.0) -> None:
    """Until `condition()`, failing at once with the build thread's error if it has one."""

    def ready() -> Any:
        assert not errors, errors
        return condition()

    until_sync(ready, timeout, interval=0.2, what="the index build")
