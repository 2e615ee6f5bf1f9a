"""One `strictq replay`: select, run (baseline then candidate), compare, report.

Bad input never ends in a traceback. A selection that matches nothing, a missing directory or a
recording whose selected messages all lack their bodies is a `UsageError` (exit 2) whose message names
the messages or files; messages whose bodies cannot be rebuilt (redacted, metadata-only, no delivery
record) are skipped and named while the rest is replayed; torn lines and records of a foreign schema
version are skipped by the reader and named per file in the report's notes.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from fencing.replay.compare import MessageComparison, compare_message
from fencing.replay.masking import MaskConfig, Masker
from fencing.replay.report import ReplayReport, Skipped
from fencing.replay.run import RunError, Runner, RunSettings
from fencing.replay.stories import MessageStory, Selection, read_stories
from wirelog.record import ACTION_UNMATCHED

KEY_FILE = "redaction.key"


class UsageError(Exception):
    """Bad input: the CLI prints the message and exits 2."""


@dataclass
class ReplayOptions:
    wirelog: Path
    selection: Selection
    worker: list[str]
    report_dir: Path
    baseline: list[str] | None = None
    key_dir: Path | None = None
    redaction: Path | None = None
    masks: MaskConfig = field(default_factory=MaskConfig)
    attempts: int = 1
    message_timeout: float = 30.0
    timeout: float = 600.0
    grace: float = 5.0
    max_slowdown: float | None = None


class Progress:
    """What the session tells its caller while it runs (the terminal's progress bar implements it)."""

    def start_run(self, name: str, total: int) -> None: ...

    def advance(self, message_id: str, outcome: str) -> None: ...

    def note(self, text: str) -> None: ...


def load(options: ReplayOptions) -> tuple[list[MessageStory], list[Skipped], list[str], Masker]:
    """Read the recording and apply the selection: (replayable in original order, skipped, notes)."""
    if not options.wirelog.is_dir():
        raise UsageError(f"--wirelog {options.wirelog} is not a directory")
    masker = Masker(options.masks)
    stories, _untagged, stats = read_stories(options.wirelog, masker)
    notes = [f"recording: {note}" for note in stats.notes]
    if stats.problems:
        notes.insert(0, f"recording: {stats.summary()}")
    if not stories:
        raise UsageError(
            f"the wire log in {options.wirelog} holds no message records"
            + (f" ({stats.summary()})" if stats.files else " (no segments)")
        )
    selected = options.selection.select(stories.values())
    if not selected:
        queues = sorted({s.queue for s in stories.values() if s.queue})
        raise UsageError(
            f"no recorded attempts match the selection ({options.selection.describe()}); the recording has "
            f"{len(stories)} message(s) in queue(s) {', '.join(queues) or '-'}"
        )
    replayable = [s for s in selected if s.body_problem is None]
    skipped = [
        Skipped(s.message_id, s.queue, s.group, s.body_problem or "") for s in selected if s.body_problem
    ]
    if not replayable:
        names = "; ".join(f"{s.message_id}: {s.reason}" for s in skipped[:10])
        raise UsageError(f"none of the {len(selected)} selected message(s) can be rebuilt: {names}")
    tenants = sorted({s.tenant for s in replayable if s.tenant})
    if len(tenants) > 1:
        raise UsageError(
            f"the selection spans tenants {', '.join(tenants)}: a worker sees one tenant; select with --queue"
        )
    return replayable, skipped, notes, masker


async def run(options: ReplayOptions, runner: Runner, progress: Progress | None = None) -> ReplayReport:
    """The whole replay, each run carried out by `runner` (strictq.replay_stack composes the isolated
    stack); raises UsageError for bad input (nothing was run)."""
    progress = progress or Progress()
    messages, skipped, notes, masker = await asyncio.to_thread(load, options)
    report = ReplayReport(
        recording=options.wirelog,
        report_dir=options.report_dir,
        reference="baseline" if options.baseline else "recording",
        selection=options.selection,
        masks=options.masks.to_dict(),
        attempts=options.attempts,
        started_at=time.time(),
        skipped=skipped,
        notes=notes,
    )
    options.report_dir.mkdir(parents=True, exist_ok=True)
    mask_file: Path | None = None
    if not options.masks.empty:
        mask_file = options.report_dir / "masks.json"
        mask_file.write_bytes(orjson.dumps(options.masks.to_dict(), option=orjson.OPT_INDENT_2))
    with tempfile.TemporaryDirectory(prefix="strictq-replay-key-") as spare:
        key_dir = _key_dir(options, Path(spare), report.notes)
        runs = [("baseline", options.baseline)] if options.baseline else []
        runs.append(("candidate", options.worker))
        results: dict[str, dict[str, MessageStory]] = {}
        for name, command in runs:
            assert command is not None
            work_dir = options.report_dir / "runs" / name
            shutil.rmtree(work_dir, ignore_errors=True)  # an earlier report's wire log must not mix in
            settings = RunSettings(
                name=name,
                command=command,
                recording=options.wirelog,
                work_dir=work_dir,
                key_dir=key_dir,
                redaction=options.redaction,
                mask_file=mask_file,
                attempts=options.attempts,
                message_timeout=options.message_timeout,
                timeout=options.timeout,
                grace=options.grace,
            )
            progress.start_run(name, len(messages))
            try:
                result = await runner(settings, messages, progress.advance)
            except RunError as exc:
                raise UsageError(str(exc)) from None
            report.runs.append(result)
            report.notes.extend(result.notes)
            stories, untagged, stats = await asyncio.to_thread(
                read_stories, result.wirelog, masker, message_ids=[m.message_id for m in messages]
            )
            report.notes.extend(f"{name} run: {note}" for note in stats.notes)
            if untagged:
                unmatched = sum(c.action == ACTION_UNMATCHED for c in untagged)
                shown = ", ".join(c.label for c in untagged[:3]) + (", ..." if len(untagged) > 3 else "")
                report.notes.append(
                    f"{name} run: {len(untagged)} call(s) not tagged with a message ({unmatched} unmatched): "
                    f"{shown}"
                )
            results[name] = stories
    baseline = results.get("baseline")

    def reference_of(message: MessageStory) -> MessageStory:
        if baseline is None:
            return message  # the recording
        found = baseline.get(message.message_id)
        return found or MessageStory(message.message_id, message.queue, group=message.group)

    candidate = results["candidate"]
    report.comparisons = [_compare(reference_of(m), candidate.get(m.message_id), options) for m in messages]
    report.finished_at = time.time()
    return report


def _compare(
    reference: MessageStory, candidate: MessageStory | None, options: ReplayOptions
) -> MessageComparison:
    return compare_message(reference, candidate, attempts=options.attempts, max_slowdown=options.max_slowdown)


def _key_dir(options: ReplayOptions, spare: Path, notes: list[str]) -> Path:
    """The recording's redaction key: the run must tokenize secrets exactly as the recording did."""
    if options.key_dir is not None:
        if not (options.key_dir / KEY_FILE).is_file():
            raise UsageError(f"--redaction-key-dir {options.key_dir} has no {KEY_FILE}")
        return options.key_dir
    beside = options.wirelog.resolve().parent
    if (beside / KEY_FILE).is_file():  # strictq serve: <data-dir>/redaction.key beside <data-dir>/wirelog
        return beside
    notes.append(
        f"no {KEY_FILE} beside {options.wirelog} (give --redaction-key-dir): calls carrying secrets will "
        "not match the recording"
    )
    return spare
