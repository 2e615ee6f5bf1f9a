"""Records are indexable within a minute while the server runs, and `strictq index` says why it indexed
nothing (issue 14, "the first hour").

`strictq index` indexes closed segments only and remembers what it indexed by whole segment, so the
writers close a segment once it is `max_segment_age` old (30 s by default, `$STRICTQ_WIRELOG_SEGMENT_AGE`):
here a fraction of a second. An index run that finds no closed segment exits 1 before starting a JVM,
naming the file names it looks for.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kit import CLIENT_ENV, LISTENING, FakeClock, launch, strictq, until_sync
from serve_support import Serve

from spark import layout
from wirelog.layout import CLOSED, OPEN, parse_segment_name
from wirelog.reader import read_records, segments
from wirelog.record import event_record
from wirelog.writer import DEFAULT_SEGMENT_AGE, ENV_SEGMENT_AGE, WireLogWriter, default_segment_age

AGE = 0.2


def _event(n: int) -> dict[str, Any]:
    return event_record(event="fence", worker="w1", message_id=f"m-{n}", reason=f"n={n}")


def _states(directory: Path) -> list[str]:
    names = (parse_segment_name(p.name) for p in directory.iterdir())
    return sorted(n.state for n in names if n is not None)


def _index(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(strictq("index", *args), capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------ the writer
def test_an_idle_segment_closes_on_age_and_idle_ticks_make_no_files(tmp_path: Path) -> None:
    clock = FakeClock()
    with WireLogWriter(tmp_path, "gateway", max_segment_age=AGE, compress=False, clock=clock) as writer:
        writer.tick()
        assert _states(tmp_path) == []  # nothing written: no segment, not even an empty one
        for n in range(3):
            writer.write(_event(n))
        clock.advance(AGE / 2)
        writer.tick()
        assert _states(tmp_path) == [OPEN]  # younger than the age: still open
        clock.advance(AGE)
        writer.tick()
        assert _states(tmp_path) == [CLOSED]  # idle and old enough: closed without another write
        for _ in range(5):  # idle from here on: no new (empty) segments
            clock.advance(AGE * 3)
            writer.tick()
        assert _states(tmp_path) == [CLOSED]
        writer.write(_event(3))
        assert _states(tmp_path) == [CLOSED, OPEN]
    assert [r["message_id"] for r in read_records(tmp_path)] == ["m-0", "m-1", "m-2", "m-3"]


def test_segment_age_default_and_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV_SEGMENT_AGE, raising=False)
    assert default_segment_age() == DEFAULT_SEGMENT_AGE == 30.0
    for text, seconds in (("0.25", 0.25), ("45s", 45.0), ("2m", 120.0)):
        monkeypatch.setenv(ENV_SEGMENT_AGE, text)
        assert default_segment_age() == seconds
    with WireLogWriter(tmp_path, "core") as writer:
        assert writer.max_segment_age == 120.0  # a writer given no age takes the environment's
    with WireLogWriter(tmp_path, "core", max_segment_age=5.0) as writer:
        assert writer.max_segment_age == 5.0
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(ENV_SEGMENT_AGE, bad)
        with caplog.at_level(logging.WARNING, logger="wirelog"):
            caplog.clear()
            assert default_segment_age() == DEFAULT_SEGMENT_AGE
        assert ENV_SEGMENT_AGE in caplog.text and "30" in caplog.text


# ------------------------------------------------------------------------------ the index, while live
def test_a_live_writers_records_are_indexed_once_each(spark: Any, tmp_path: Path) -> None:
    from spark.index import run_index

    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    writer = WireLogWriter(wirelog, "gateway", max_segment_age=AGE, compress=True)

    def closed() -> int:
        writer.tick()
        return len(segments(wirelog, include_open=False))  # one per segment, mid-compression too

    try:
        for n in range(5):
            writer.write(_event(n))
        until_sync(lambda: closed() >= 1, what="the first segment closed by age")
        writer.write(_event(5))  # open: not indexed by this run
        first = run_index(spark, wirelog, index, buckets=2)
        assert first.records == 5
        until_sync(lambda: closed() >= 2, what="the second segment closed by age")
        writer.write(_event(6))  # open again
        writer.wait_compressed(10)
        second = run_index(spark, wirelog, index, buckets=2)  # the .jsonl now a .jsonl.gz: not again
        assert (second.records, second.already_indexed) == (1, 1)
        assert layout.load_state(index).records == 6  # every closed record once, the open one not yet
    finally:
        writer.close()


def test_a_running_server_closes_its_segments_and_index_finds_them(tmp_path: Path) -> None:
    """`strictq serve` with a short segment age: a delivery is in a closed segment while it runs."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    command = strictq("serve", "--port", "0", "--data-dir", str(data), "--no-proxy", "--insecure-http")
    serve = launch(
        command,
        tmp_path / "serve.log",
        wait_for=[LISTENING, CLIENT_ENV],
        make=Serve,
        env={ENV_SEGMENT_AGE: "0.3"},
    )
    try:
        serve.data_dir, serve.url, serve.ca = data, serve.startup[LISTENING].split()[-1], None
        status, _ = serve.call("POST", "/queue/1/orders/send?group=g1", serve.secret("producer"), {"n": 1})
        assert status == 200
        status, polled = serve.call("GET", "/queue/1/orders/poll?ttl=30&limit=1", serve.secret("worker"))
        assert status == 200 and len(polled) == 1

        def delivered() -> list[dict[str, Any]]:
            found = read_records(data / "wirelog", include_open=False)
            return [r for r in found if r["kind"] == "delivery" and r["message_id"] == polled[0]["id"]]

        until_sync(delivered, what="the delivery record in a closed segment while the server runs")
        assert serve.running()
    finally:
        serve.stop()


# ----------------------------------------------------------------------------- nothing to index: say so
def test_index_of_an_empty_or_misnamed_directory_exits_1_naming_what_it_looks_for(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _index("--wirelog", str(empty), "--index", str(tmp_path / "index"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"strictq: index: no wire-log segments in {empty} (looked for files named")
    assert ".jsonl.gz" in done.stderr and len(done.stderr.splitlines()) == 1
    assert "Spark" not in done.stderr and "Traceback" not in done.stderr and not done.stdout
    assert not (tmp_path / "index").exists()  # nothing touched

    data = tmp_path / "data"  # the data dir given instead of its wirelog/
    with WireLogWriter(data / "wirelog", "core") as writer:
        writer.write(_event(1))
    done = _index("--wirelog", str(data), "--index", str(tmp_path / "index"))
    assert done.returncode == 1
    assert f"did you mean --wirelog {data / 'wirelog'}?" in done.stderr


def test_an_index_directory_that_cannot_be_made_is_one_line_before_spark(tmp_path: Path) -> None:
    wirelog = tmp_path / "wirelog"
    with WireLogWriter(wirelog, "core") as writer:  # closed on exit: something to index
        writer.write(_event(1))
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = _index("--wirelog", str(wirelog), "--index", str(blocker / "index"))
    assert done.returncode == 2, done.stderr
    line = f"strictq: index directory {blocker / 'index'}: cannot create or write it (Not a directory)\n"
    assert done.stderr == line
    assert "Spark" not in done.stderr and not done.stdout


def test_index_with_only_open_segments_exits_1_and_says_when_to_come_back(tmp_path: Path) -> None:
    with WireLogWriter(tmp_path / "wirelog", "gateway", fsync="always") as writer:
        writer.write(_event(1))
        done = _index("--wirelog", str(tmp_path / "wirelog"), "--index", str(tmp_path / "index"))
    assert done.returncode == 1
    assert "no closed wire-log segment" in done.stderr and "1 still open (*.jsonl.open)" in done.stderr
    assert ENV_SEGMENT_AGE in done.stderr and "Spark" not in done.stderr


# A quiet Spark start (one line before the JVM, none of Spark's banner) is checked on the real
# `strictq index` rerun of tests/test_spark_build.py's killed-index test: one JVM start fewer.
