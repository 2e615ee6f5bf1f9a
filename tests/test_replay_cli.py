"""`strictq replay` end to end: a real recording (strictq serve + the SDK worker + a real backend, see
replay_support), replayed by the real command against variants of the worker.

Every test also checks that the backend, still listening at the recorded address, accepted no
connection while replay ran: nothing leaves the machine.
"""

from __future__ import annotations

import gzip
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from replay_support import CountingBackend, Recording, ReplayRun, make_recording, run_replay, worker_command

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def backend() -> Iterator[CountingBackend]:
    server = CountingBackend().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory, backend: CountingBackend) -> Recording:
    made = make_recording(tmp_path_factory.mktemp("recording"), backend)
    assert backend.accepted > 0 and backend.requests == 24  # 3 calls: 7 messages, order 5 twice
    return made


def replay(recording: Recording, tmp_path: Path, *args: str) -> ReplayRun:
    """Run `strictq replay` and prove that no connection reached the backend meanwhile."""
    before = recording.backend.accepted
    result = run_replay(recording, tmp_path / "report", *args)
    assert recording.backend.accepted == before, "a call left the machine during replay"
    return result


def orders(*worker_args: str) -> tuple[str, ...]:
    return ("--queue", "orders", "--worker", worker_command("--queue", "orders", *worker_args))


def test_the_recording_holds_both_sides(recording: Recording) -> None:
    from wirelog.reader import read_records

    records = list(read_records(recording.wirelog))
    deliveries = [r for r in records if r["kind"] == "delivery"]
    assert {r["writer"] for r in deliveries} == {"gateway"}
    assert len(deliveries) == 8  # 7 messages, order 5 delivered twice
    events = {r["event"] for r in records if r["kind"] == "event"}
    results = {r["outcome"] for r in records if r["kind"] == "log"}  # workers that report results
    assert events >= {"ack", "release"} or results >= {"succeeded", "failed"}
    calls = [r for r in records if r["kind"] == "http" and r["message_id"] is not None]
    assert len(calls) == 24 and all(r["action"] == "pass" for r in calls)


def test_identical_worker_has_no_divergence(recording: Recording, tmp_path: Path) -> None:
    result = replay(recording, tmp_path, *orders())
    assert result.code == 0, result.stderr + result.stdout
    assert result.report is not None
    summary = result.report["summary"]
    assert summary["replayed"] == 5 and summary["diverged"] == 0 and summary["unmatched_calls"] == 0
    assert result.diverged == {}
    fifth = result.message(recording.id_of(5))  # its recorded first attempt failed; so does the candidate's
    assert fifth["reference"]["outcome"] == fifth["candidate"]["outcome"] == "fail"
    for message in result.report["messages"]:
        calls = message["candidate"]["attempts"][0]["calls"]
        assert [c["action"] for c in calls] == ["mimic"] * 3
    assert "0 of 5 replayed message(s) diverged" in result.stdout


@pytest.mark.parametrize(
    ("variant", "kind"),
    [
        ("body", "call-changed"),
        ("added", "call-added"),
        ("removed", "call-removed"),
        ("swapped", "calls-swapped"),
        ("fail", "outcome"),
    ],
)
def test_each_variant_is_reported_on_its_message(
    recording: Recording, tmp_path: Path, variant: str, kind: str
) -> None:
    result = replay(recording, tmp_path, *orders("--variant", variant, "--target", "3"))
    assert result.code == 1, result.stderr + result.stdout
    target = recording.id_of(3)
    assert result.diverged == {target: [kind]}
    message = result.message(target)
    assert message["first_difference"].startswith("attempt 1: ")
    if variant == "body":
        assert '-  "amount": 30,' in message["first_difference"]
        assert '+  "amount": 31,' in message["first_difference"]
    if variant == "fail":
        assert message["reference"]["outcome"] == "ack" and message["candidate"]["outcome"] == "fail"
    html = (result.report_dir / "report.html").read_text()
    assert f'id="m-{target}"' in html and kind in html
    assert target in result.stdout


def test_a_call_the_recording_cannot_answer_is_refused_not_sent(recording: Recording, tmp_path: Path) -> None:
    result = replay(recording, tmp_path, *orders("--variant", "audit", "--target", "1"))
    assert result.code == 1
    target = recording.id_of(1)
    assert result.diverged == {target: ["call-added", "unmatched"]}
    calls = result.message(target)["candidate"]["attempts"][0]["calls"]
    audit = next(c for c in calls if c["path"] == "/audit")
    assert audit["action"] == "unmatched" and audit["status"] == 503
    assert result.report is not None and result.report["summary"]["unmatched_calls"] == 1


def test_baseline_mode_compares_two_workers(recording: Recording, tmp_path: Path) -> None:
    result = replay(
        recording,
        tmp_path,
        "--queue",
        "orders",
        "--baseline-worker",
        worker_command("--queue", "orders", "--variant", "body", "--target", "2"),
        "--worker",
        worker_command("--queue", "orders", "--variant", "body", "--variant", "removed", "--target", "2"),
    )
    assert result.code == 1, result.stderr + result.stdout
    assert result.report is not None and result.report["reference"] == "baseline"
    assert [run["name"] for run in result.report["runs"]] == ["baseline", "candidate"]
    target = recording.id_of(2)
    # Both charge differently from the recording; compared with each other only the notify is gone.
    assert result.diverged == {target: ["call-removed"]}
    assert "candidate vs baseline" in result.stdout


def test_masking_a_timestamp_stops_a_false_divergence(recording: Recording, tmp_path: Path) -> None:
    stamped = ("--queue", "stamped", "--worker", worker_command("--queue", "stamped", "--stamp"))
    unmasked = replay(recording, tmp_path / "unmasked", *stamped)
    assert unmasked.code == 1
    assert list(unmasked.diverged.values()) == [["call-changed"], ["call-changed"]]
    assert "sent_at" in unmasked.stdout
    masked = replay(recording, tmp_path / "masked", *stamped, "--mask-json", "$.sent_at")
    assert masked.code == 0, masked.stdout
    assert masked.report is not None and masked.report["masks"]["json_paths"] == ["$.sent_at"]
    calls = masked.report["messages"][0]["candidate"]["attempts"][0]["calls"]
    assert [c["action"] for c in calls] == ["mimic"] * 3  # matched through the mask, not by endpoint
    assert '"sent_at":"<masked>"' in calls[2]["body"]


def test_selecting_by_outcome(recording: Recording, tmp_path: Path) -> None:
    result = replay(recording, tmp_path, *orders(), "--outcome", "failed")
    assert result.code == 0, result.stderr + result.stdout
    assert result.report is not None
    assert [m["message_id"] for m in result.report["messages"]] == [recording.id_of(5)]


def test_usage_errors_exit_2_with_one_line(recording: Recording, tmp_path: Path) -> None:
    cases = [
        (("--queue", "nope", "--worker", "true"), "no recorded attempts match the selection (queue nope)"),
        (("--worker", "true", "--since", "yesterday-ish"), "not a time"),
        (("--worker", "true", "--attempts", "0"), "--attempts"),
        (("--worker", "", "--queue", "orders"), "--worker is empty"),
        (("--worker", "true", "--mask-json", "sent_at"), "must start with '$'"),
    ]
    for args, expected in cases:
        result = run_replay(recording, tmp_path / "r", *args)
        assert result.code == 2, (args, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    missing = run_replay(
        Recording(tmp_path / "absent", tmp_path, recording.backend), tmp_path / "r", "--worker", "true"
    )
    assert missing.code == 2 and "is not a directory" in missing.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = run_replay(recording, blocker / "report", "--queue", "orders", "--worker", "true")
    assert unwritable.code == 2 and "Traceback" not in unwritable.stderr, unwritable.stderr
    assert f"--report {blocker / 'report'}: cannot write the report there ({blocker} is not a directory)" in (
        unwritable.stderr
    )


def test_a_worker_that_cannot_start_is_a_usage_error(recording: Recording, tmp_path: Path) -> None:
    result = replay(recording, tmp_path, "--queue", "orders", "--worker", "/nonexistent/worker --fast")
    assert result.code == 2
    assert "worker command cannot start: /nonexistent/worker --fast" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_recordings_skip_what_cannot_be_replayed(recording: Recording, tmp_path: Path) -> None:
    """Bodies redacted or not kept, a torn segment, a foreign schema version: named, and the rest runs."""
    from wirelog.reader import read_records
    from wirelog.writer import WireLogWriter

    copy = tmp_path / "bad" / "wirelog"
    redacted, metadata = recording.id_of(1), recording.id_of(3)
    writers: dict[str, WireLogWriter] = {}
    for record in read_records(recording.wirelog):
        record = dict(record)
        name = record.pop("writer")
        record.pop("id")
        if record["kind"] == "delivery" and record["message_id"] == redacted:
            record["body_redacted"] = True
        if record["kind"] == "delivery" and record["message_id"] == metadata:
            record["body"] = None
        if name not in writers:
            writers[name] = WireLogWriter(copy, name, compress=False)
        writers[name].write(record)
    for writer in writers.values():
        writer.close()
    (copy / "old.20200101T000000000000Z.000001.jsonl").write_bytes(
        orjson.dumps({"v": 99, "kind": "http"}) + b"\n" + b'{"v": 1, "kind": "ht'
    )
    (copy.parent / "redaction.key").write_bytes((recording.key_dir / "redaction.key").read_bytes())
    bad = Recording(copy, copy.parent, recording.backend, recording.ids)
    result = replay(bad, tmp_path, *orders())
    assert result.code == 0, result.stderr + result.stdout
    assert result.report is not None
    skipped = {s["message_id"]: s["reason"] for s in result.report["skipped"]}
    assert set(skipped) == {redacted, metadata}
    assert "redacted" in skipped[redacted] and "not recorded" in skipped[metadata]
    assert result.report["summary"]["replayed"] == 3
    notes = "\n".join(result.report["notes"])
    assert "old.20200101T000000000000Z.000001.jsonl" in notes
    assert "unknown schema version" in notes and "torn" in notes
    assert f"skipped {redacted}" in result.stdout


def test_the_html_report_is_self_contained(recording: Recording, tmp_path: Path) -> None:
    result = replay(recording, tmp_path, *orders("--variant", "body", "--target", "4"))
    html = (result.report_dir / "report.html").read_text()
    assert html.startswith("<!doctype html>") and "<script" not in html and "http-equiv" not in html
    assert "stylesheet" not in html and "src=" not in html
    assert f'Diverging messages: <a href="#m-{recording.id_of(4)}">' in html
    assert "&quot;amount&quot;: 41" in html  # bodies are escaped data
    segments = list((result.report_dir / "runs" / "candidate" / "wirelog").glob("proxy.*.jsonl.gz"))
    lines = [line for s in segments for line in gzip.decompress(s.read_bytes()).split(b"\n") if line]
    candidate_calls = [orjson.loads(line) for line in lines]
    assert candidate_calls and all(r["action"] == "mimic" and r["replayed_from"] for r in candidate_calls)


# A worker wrapper: starts a child that ignores SIGTERM (its pid into PIDFILE), then either exits at once
# (`--exit CODE`, after a last line naming why) or becomes the worker `--run ARGV...` (exec, same pid).
WRAPPER = """\
import os, signal, subprocess, sys
pid_file, mode, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
stubborn = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(300)"
)
child = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)
assert child.stdout is not None and child.stdout.readline() == b"ready\\n"  # its SIGTERM handler is set
open(pid_file, "w").write(str(child.pid))
if mode == "--exit":
    print("myworker: cannot connect to the payments service", flush=True)
    sys.exit(int(rest[0]))
os.execv(rest[0], rest)
"""


def wrapped_worker(tmp_path: Path, *args: str) -> tuple[str, Path]:
    script, pid_file = tmp_path / "wrapper.py", tmp_path / "stubborn.pid"
    script.write_text(WRAPPER)
    return shlex.join([sys.executable, str(script), str(pid_file), *args]), pid_file


def gone(pid_file: Path) -> bool:
    """The stubborn child is not running (a zombie waiting for its reaper counts as gone)."""
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_leftover(pid_file: Path) -> None:
    """If the test fails, the child it proved left behind is not left running."""
    if pid_file.exists() and not gone(pid_file):
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_worker_that_exits_before_taking_a_message_could_not_run(
    recording: Recording, tmp_path: Path
) -> None:
    """Exit 2 (could not run), not 1 (divergence): nothing was compared. Its last line says why, and the
    child it left behind (ignoring SIGTERM) is killed with its process group."""
    command, pid_file = wrapped_worker(tmp_path, "--exit", "3")
    try:
        result = replay(recording, tmp_path, "--queue", "orders", "--worker", command, "--grace", "0.5")
        assert result.code == 2, result.stderr + result.stdout
        line = result.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, result.stderr
        assert "worker exited with code 3 before it took any message" in line
        assert "myworker: cannot connect to the payments service" in line
        assert gone(pid_file), "the worker's child outlived the replay"
    finally:
        kill_leftover(pid_file)


def test_the_worker_process_group_is_stopped_whole(recording: Recording, tmp_path: Path) -> None:
    """A worker whose child ignores SIGTERM: the run completes as usual, and the child is SIGKILLed after
    --grace with the rest of the worker's process group."""
    real = worker_command("--queue", "orders")
    command, pid_file = wrapped_worker(tmp_path, "--run", *shlex.split(real))
    try:
        result = replay(recording, tmp_path, "--queue", "orders", "--worker", command, "--grace", "0.5")
        assert result.code == 0, result.stderr + result.stdout
        assert gone(pid_file), "the worker's child outlived the replay"
    finally:
        kill_leftover(pid_file)
