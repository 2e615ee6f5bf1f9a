"""The replay report: one value the terminal summary, the JSON file and the HTML page are written from.

JSON (`report.json`, for CI): `version` (1), `exit_code`, `summary` {messages, replayed, same,
diverged, skipped, unmatched_calls, kinds: {kind: count}}, `reference` ("recording" | "baseline"),
`selection`, `masks`, `attempts`, `runs` (command, worker exit, logs, wire log), `messages` (one per
replayed message: status, kinds, first_difference, divergences, both sides' attempts and calls),
`skipped` (message id + reason), `notes` (what the read or the runs skipped or noticed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fencing.replay.compare import MessageComparison
from fencing.replay.run import RunResult
from fencing.replay.stories import Selection
from wirelog.times import format_time

REPORT_VERSION = 1


@dataclass
class Skipped:
    message_id: str
    queue: str | None
    group: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "queue": self.queue,
            "group": self.group,
            "reason": self.reason,
        }


@dataclass
class ReplayReport:
    recording: Path
    report_dir: Path
    reference: str  # "recording" | "baseline"
    selection: Selection
    masks: dict[str, list[str]]
    attempts: int
    started_at: float
    finished_at: float = 0.0
    runs: list[RunResult] = field(default_factory=list)
    comparisons: list[MessageComparison] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def diverged(self) -> list[MessageComparison]:
        return [c for c in self.comparisons if c.diverged]

    @property
    def exit_code(self) -> int:
        return 1 if self.diverged else 0

    @property
    def unmatched_calls(self) -> int:
        return sum(d.kind == "unmatched" for c in self.comparisons for d in c.divergences)

    def summary(self) -> dict[str, Any]:
        kinds = Counter(kind for c in self.comparisons for kind in c.kinds)
        return {
            "messages": len(self.comparisons) + len(self.skipped),
            "replayed": len(self.comparisons),
            "same": len(self.comparisons) - len(self.diverged),
            "diverged": len(self.diverged),
            "skipped": len(self.skipped),
            "unmatched_calls": self.unmatched_calls,
            "kinds": dict(sorted(kinds.items())),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "exit_code": self.exit_code,
            "started_at": format_time(self.started_at),
            "finished_at": format_time(self.finished_at),
            "recording": str(self.recording),
            "reference": self.reference,
            "selection": self.selection.to_dict(),
            "masks": self.masks,
            "attempts": self.attempts,
            "summary": self.summary(),
            "runs": [r.to_dict() for r in self.runs],
            "messages": [c.to_dict() for c in self.comparisons],
            "skipped": [s.to_dict() for s in self.skipped],
            "notes": self.notes,
        }


def write_json(report: ReplayReport, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    return path
