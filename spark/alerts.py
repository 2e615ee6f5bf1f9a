"""Alert rules over error signatures: "N failures matching X within a window" -> an alert event.

Rules live in TOML (a top-level `[alerts]` table is used when present, so they can share a file):

```toml
[[alerts.rule]]
name = "payments-5xx"
signature = "http POST api.payments.example/* 5xx*"   # glob over the signature, or
# template = "timeout after <n> ms waiting for lock <hex>"   # glob over the Drain template
threshold = 10          # failures in one window
window = "5m"           # tumbling windows aligned to the epoch: 30s, 5m, 1h, 1d
severity = "page"       # optional, carried into the event
```

Each firing (rule, window) becomes a wire-log `event` record (`event = "alert"`, the details under
`alert`) written by the writer `spark-alerts` into the wire-log directory, where the queue core's
failure management reads events like any other record; it is also printed and logged. Firings already
emitted are remembered in `<index>/errors/alerts-state.json`, so a rerun does not repeat them (an
alert is emitted at least once: a crash between writing and remembering repeats it).
"""

from __future__ import annotations

import fnmatch
import logging
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from wirelog.times import TimeParseError, parse_duration

from . import layout
from .errors import ErrorReport

log = logging.getLogger("strictq.alerts")
WRITER = "spark-alerts"
STATE_FILE = "alerts-state.json"
KEEP_FIRED_SECONDS = 90 * 86400
_KEYS = {"name", "signature", "template", "threshold", "window", "severity"}


class AlertConfigError(ValueError):
    """The alert rules file is invalid (the message names the rule and the key)."""


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    threshold: int
    window: int  # seconds
    signature: str | None = None
    template: str | None = None
    severity: str = "warning"

    def matches(self, signature: str, template: str | None) -> bool:
        if self.signature is not None:
            return fnmatch.fnmatchcase(signature, self.signature)
        return (
            template is not None
            and self.template is not None
            and fnmatch.fnmatchcase(template, self.template)
        )

    @property
    def pattern(self) -> str:
        return (
            f"signature {self.signature!r}" if self.signature is not None else f"template {self.template!r}"
        )


@dataclass(frozen=True, slots=True)
class Alert:
    rule: AlertRule
    window_start: float
    count: int
    signatures: tuple[str, ...]

    @property
    def window_end(self) -> float:
        return self.window_start + self.rule.window

    def text(self) -> str:
        from wirelog.times import format_time

        return (
            f"{self.rule.name}: {self.count} failure(s) matching {self.rule.pattern} in "
            f"{format_time(self.window_start)} .. {format_time(self.window_end)} "
            f"(threshold {self.rule.threshold})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule.name,
            "severity": self.rule.severity,
            "signature": self.rule.signature,
            "template": self.rule.template,
            "threshold": self.rule.threshold,
            "window_seconds": self.rule.window,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "count": self.count,
            "signatures": list(self.signatures),
        }


def parse_window(text: Any) -> int:
    try:
        seconds = int(parse_duration(str(text), unit_required=True))
    except TimeParseError:
        seconds = 0
    if seconds <= 0:
        raise AlertConfigError(f"window {text!r}: use a duration like 30s, 5m, 1h or 1d")
    return seconds


def load_rules(path: Path) -> list[AlertRule]:
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AlertConfigError(f"{path}: {exc}") from None
    table = doc.get("alerts", doc)
    raw_rules = table.get("rule", [])
    if not isinstance(raw_rules, list) or not raw_rules:
        raise AlertConfigError(f"{path}: no [[alerts.rule]] (or [[rule]]) tables")
    rules: list[AlertRule] = []
    for i, raw in enumerate(raw_rules):
        where = f"{path}: rule {i + 1}"
        if not isinstance(raw, dict):
            raise AlertConfigError(f"{where}: not a table")
        unknown = set(raw) - _KEYS
        if unknown:
            raise AlertConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise AlertConfigError(f"{where}: `name` (text) is required")
        where = f"{path}: rule {name!r}"
        if ("signature" in raw) == ("template" in raw):
            raise AlertConfigError(f"{where}: give exactly one of `signature` or `template` (a glob)")
        pattern = raw.get("signature", raw.get("template"))
        if not isinstance(pattern, str) or not pattern:
            raise AlertConfigError(f"{where}: the pattern must be non-empty text")
        threshold = raw.get("threshold")
        if type(threshold) is not int or threshold < 1:
            raise AlertConfigError(f"{where}: `threshold` must be an integer >= 1")
        if "window" not in raw:
            raise AlertConfigError(f"{where}: `window` is required (like 5m)")
        try:
            window = parse_window(raw["window"])
        except AlertConfigError as exc:
            raise AlertConfigError(f"{where}: {exc}") from None
        rules.append(
            AlertRule(
                name=name,
                threshold=threshold,
                window=window,
                signature=raw.get("signature"),
                template=raw.get("template"),
                severity=str(raw.get("severity", "warning")),
            )
        )
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        raise AlertConfigError(f"{path}: rule names must be unique")
    return rules


def evaluate(rules: list[AlertRule], report: ErrorReport) -> list[Alert]:
    """Every (rule, window) whose matching failures reach the threshold, oldest first."""
    template_of = {s["signature"]: s["template"] for s in report.signatures}
    alerts: list[Alert] = []
    for rule in rules:
        totals: dict[float, int] = {}
        matched: dict[float, set[str]] = {}
        for row in report.windows.get(rule.window, []):
            if rule.matches(row["signature"], template_of.get(row["signature"])):
                start = float(row["window_start"])
                totals[start] = totals.get(start, 0) + int(row["count"])
                matched.setdefault(start, set()).add(row["signature"])
        for start in sorted(totals):
            if totals[start] >= rule.threshold:
                alerts.append(Alert(rule, start, totals[start], tuple(sorted(matched[start]))))
    return sorted(alerts, key=lambda a: (a.window_start, a.rule.name))


def emit(alerts: list[Alert], *, index_dir: Path, wirelog_dir: Path | None) -> list[Alert]:
    """Write alert events (those not emitted before) to the wire log; returns the new ones."""
    state_path = Path(index_dir) / layout.ERRORS_DIR / STATE_FILE
    fired: dict[str, float] = {}
    if state_path.exists():
        fired = orjson.loads(state_path.read_bytes()).get("fired", {})
    fresh = [a for a in alerts if _key(a) not in fired]
    if not fresh:
        return []
    if wirelog_dir is not None:
        from wirelog.record import event_record
        from wirelog.writer import WireLogWriter

        with WireLogWriter(Path(wirelog_dir), WRITER, fsync="always", max_segment_age=3600.0) as writer:
            for alert in fresh:
                record = event_record(event="alert", reason=alert.text())
                record["alert"] = alert.to_json()
                writer.write(record)
    now = time.time()
    for alert in fresh:
        log.info("alert %s", alert.text())
        fired[_key(alert)] = now
    fired = {k: v for k, v in fired.items() if now - v < KEEP_FIRED_SECONDS}
    layout.write_atomic(state_path, orjson.dumps({"fired": fired}, option=orjson.OPT_INDENT_2))
    return fresh


def _key(alert: Alert) -> str:
    return f"{alert.rule.name}|{alert.rule.window}|{alert.window_start:.0f}"
