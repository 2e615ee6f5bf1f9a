"""The terminal side of `strictq replay`: a progress bar while runs go on, a summary table at the end.

rich renders both; the progress bar goes to stderr and only animates on a terminal, so piped output
and CI logs get the table alone.
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fencing.replay.report import ReplayReport
from fencing.replay.session import Progress as SessionProgress

STYLE = {"same": "green", "diverged": "bold red", "skipped": "yellow"}


class ProgressBar(SessionProgress):
    """One task per run: advanced as its messages are done (ack, fail, timeout)."""

    def __init__(self, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[last]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
            disable=not enabled or not self.console.is_terminal,
        )
        self._task: Any = None

    def __enter__(self) -> ProgressBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start_run(self, name: str, total: int) -> None:
        self._task = self.progress.add_task(f"replaying ({name})", total=total, last="")

    def advance(self, message_id: str, outcome: str) -> None:
        if self._task is not None:
            self.progress.update(self._task, advance=1, last=f"{message_id}: {outcome}")

    def note(self, text: str) -> None:
        self.progress.console.print(text)


def print_summary(report: ReplayReport, files: dict[str, str], out: IO[str] | None = None) -> None:
    """The table of messages, the first difference of each diverging one, and where the reports are."""
    console = Console(file=out, highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console.width = max(console.width, 132)  # CI logs: room for full message ids
    reference = "recorded" if report.reference == "recording" else "baseline"
    table = Table(title=f"strictq replay: candidate vs {reference}", title_justify="left")
    table.add_column("message", no_wrap=True)
    table.add_column("group")
    table.add_column(reference)
    table.add_column("candidate")
    table.add_column("calls", justify="right")
    table.add_column("latency ms", justify="right")
    table.add_column("result")
    for comparison in report.comparisons:
        status = "diverged" if comparison.diverged else "same"
        result = ", ".join(comparison.kinds) if comparison.diverged else "same"
        ref_calls = sum(len(a.calls) for a in comparison.reference)
        cand_calls = sum(len(a.calls) for a in comparison.candidate)
        table.add_row(
            comparison.message_id,
            comparison.group or "-",
            comparison.outcome("reference"),
            comparison.outcome("candidate"),
            f"{ref_calls} / {cand_calls}",
            f"{_ms(comparison.latency_ms('reference'))} / {_ms(comparison.latency_ms('candidate'))}",
            Text(result, style=STYLE[status]),
        )
    for skipped in report.skipped:
        table.add_row(
            skipped.message_id,
            skipped.group or "-",
            "-",
            "-",
            "-",
            "-",
            Text("skipped", style=STYLE["skipped"]),
        )
    console.print(table)
    for comparison in report.diverged:
        console.print(Text(f"\n{comparison.message_id}: {comparison.first_difference}", style="red"))
    for skipped in report.skipped:
        console.print(Text(f"skipped {skipped.message_id}: {skipped.reason}", style="yellow"))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    summary = report.summary()
    line = (
        f"\n{summary['diverged']} of {summary['replayed']} replayed message(s) diverged"
        f" ({summary['same']} same, {summary['skipped']} skipped,"
        f" {summary['unmatched_calls']} unmatched call(s))"
    )
    console.print(Text(line, style="bold red" if summary["diverged"] else "bold green"))
    for label, path in files.items():
        console.print(f"{label}: {path}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
