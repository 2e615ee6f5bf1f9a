"""`report.html`: one self-contained page (inline CSS, no scripts, no external files) with the summary,
a row per message, and per diverging message its divergences, the readable first difference and both
sides' calls. Everything from the wire log is escaped: bodies are data, never markup."""

from __future__ import annotations

from html import escape
from pathlib import Path

from fencing.replay.compare import MessageComparison
from fencing.replay.report import ReplayReport
from fencing.replay.stories import Attempt
from wirelog.times import format_time

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.same { color: #176b2c; } .diverged { color: #b00020; font-weight: bold; } .skipped { color: #8a6d00; }
pre { background: #f7f7f7; border: 1px solid #ddd; padding: .6em; overflow-x: auto; }
.add { color: #176b2c; } .del { color: #b00020; }
details { margin: .4em 0 1em; } summary { cursor: pointer; }
.kind { display: inline-block; background: #fde7ea; color: #b00020; border-radius: 3px; padding: 0 .4em;
        margin-right: .3em; font-size: .9em; }
"""


def write_html(report: ReplayReport, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(report), encoding="utf-8")
    return path


def render(report: ReplayReport) -> str:
    summary = report.summary()
    reference = "recording" if report.reference == "recording" else "baseline run"
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>strictq replay report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>strictq replay report</h1>",
        "<table>",
        _row("recording", str(report.recording)),
        _row("compared with", reference),
        _row("selection", report.selection.describe()),
        _row(
            "masks",
            ", ".join([*report.masks.get("json_paths", []), *report.masks.get("regexes", [])]) or "none",
        ),
        _row("attempts per message", str(report.attempts)),
        _row("started", format_time(report.started_at)),
        _row("finished", format_time(report.finished_at)),
    ]
    for run in report.runs:
        code = "-" if run.worker_exit is None else str(run.worker_exit)
        out.append(_row(f"{run.name} worker", f"{' '.join(run.command)} (exit {code})"))
    verdict = "diverged" if summary["diverged"] else "same"
    out += [
        "</table>",
        f'<p class="{verdict}">{summary["diverged"]} of {summary["replayed"]} replayed message(s) diverged; '
        f"{summary['same']} same, {summary['skipped']} skipped, "
        f"{summary['unmatched_calls']} unmatched call(s).</p>",
    ]
    if report.diverged:
        names = ", ".join(
            f'<a href="#m-{escape(c.message_id)}">{escape(c.message_id)}</a>' for c in report.diverged
        )
        out.append(f"<p>Diverging messages: {names}</p>")
    out.append("<h2>Messages</h2><table><tr><th>message</th><th>queue</th><th>group</th>")
    out.append(f"<th>{escape(reference)}</th><th>candidate</th><th>calls</th><th>result</th></tr>")
    for c in report.comparisons:
        status = "diverged" if c.diverged else "same"
        link = (
            f'<a href="#m-{escape(c.message_id)}">{escape(c.message_id)}</a>'
            if c.diverged
            else escape(c.message_id)
        )
        calls = f"{sum(len(a.calls) for a in c.reference)} / {sum(len(a.calls) for a in c.candidate)}"
        out.append(
            f"<tr><td>{link}</td><td>{escape(c.queue or '-')}</td><td>{escape(c.group or '-')}</td>"
            f"<td>{escape(c.outcome('reference'))}</td><td>{escape(c.outcome('candidate'))}</td>"
            f'<td>{calls}</td><td class="{status}">{escape(", ".join(c.kinds) or "same")}</td></tr>'
        )
    for s in report.skipped:
        out.append(
            f"<tr><td>{escape(s.message_id)}</td><td>{escape(s.queue or '-')}</td>"
            f"<td>{escape(s.group or '-')}</td>"
            f'<td colspan="3">{escape(s.reason)}</td><td class="skipped">skipped</td></tr>'
        )
    out.append("</table>")
    for c in report.diverged:
        out.append(_message(c, reference))
    if report.notes:
        out.append("<h2>Notes</h2><ul>")
        out.extend(f"<li>{escape(note)}</li>" for note in report.notes)
        out.append("</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


def _row(label: str, value: str) -> str:
    return f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>"


def _message(c: MessageComparison, reference: str) -> str:
    out = [
        f'<h2 id="m-{escape(c.message_id)}">{escape(c.message_id)} '
        f"<small>(queue {escape(c.queue or '-')}, group {escape(c.group or '-')})</small></h2>",
        "<p>" + "".join(f'<span class="kind">{escape(k)}</span>' for k in c.kinds) + "</p>",
        "<p>First difference:</p>",
        f"<pre>{_diff_lines(c.first_difference or '')}</pre>",
    ]
    if len(c.divergences) > 1:
        out.append("<details><summary>All divergences</summary><ul>")
        for d in c.divergences:
            detail = f"<pre>{_diff_lines(d.detail)}</pre>" if d.detail else ""
            out.append(f"<li>attempt {d.attempt}: {escape(d.summary)}{detail}</li>")
        out.append("</ul></details>")
    out.append("<details><summary>Calls, side by side</summary>")
    out.append(_calls(reference, c.reference))
    out.append(_calls("candidate", c.candidate))
    out.append("</details>")
    return "\n".join(out)


def _calls(label: str, attempts: list[Attempt]) -> str:
    rows = [f"<p><b>{escape(label)}</b></p>"]
    if not attempts:
        return rows[0] + "<p>never received the message</p>"
    for attempt in attempts:
        latency = "-" if attempt.latency_ms is None else f"{attempt.latency_ms:.0f} ms"
        rows.append(
            f"<p>attempt {attempt.number}: {escape(attempt.outcome)} ({escape(latency)})"
            + (f" — {escape(attempt.reason)}" if attempt.reason else "")
            + "</p>"
        )
        rows.append("<table><tr><th>#</th><th>call</th><th>status</th><th>action</th><th>body</th></tr>")
        for index, call in enumerate(attempt.calls, 1):
            body = escape(call.body) if call.body is not None else f"sha256 {escape(call.body_sha256[:16])}…"
            rows.append(
                f"<tr><td>{index}</td><td>{escape(call.label)}</td><td>{call.status or '-'}</td>"
                f"<td>{escape(call.action)}</td><td><code>{body}</code></td></tr>"
            )
        rows.append("</table>")
    return "\n".join(rows)


def _diff_lines(text: str) -> str:
    lines = []
    for line in text.splitlines():
        css = "add" if line.startswith("+") and not line.startswith("+++") else None
        css = "del" if line.startswith("-") and not line.startswith("---") else css
        lines.append(f'<span class="{css}">{escape(line)}</span>' if css else escape(line))
    return "\n".join(lines)
