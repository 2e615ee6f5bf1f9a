"""Known error cases: masking (Python and Spark SQL agree), Drain templates, the `strictq errors` job on
a generated mix of known failures, and alert rules firing into the wire log."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_support import SampleIndex

from spark import masking
from spark.alerts import AlertConfigError, emit, evaluate, load_rules
from spark.drain import WILDCARD, templates_for
from spark.errors import run_errors
from wirelog.reader import RecordFilter, read_records

TEXTS = [
    "connection refused to 'db-7.internal' port 5432 after 1203 ms",
    'upstream "payments" said 502 for request 9f86d081-884c-4d63-8a7d-3a8f2a1f8c1e at 0x7ffe12ab',
    "lock deadbeef1234 held by worker w3 for 12.5 s",
    "card_declined for order 8842: code 'insufficient_funds'",
    "charge ch_3F2a9b8c7d6e5f failed; retry in 30s",
    "plain words only",
    "",
]
URLS = [
    "https://api.payments.example/v1/charges/ch_3f2a9b8c7d6e5f/capture?token=redacted:1",
    "https://inventory.internal:8443/v2/items/12345",
    "http://user:secret@Host.Example/a/9f86d081-884c-4d63-8a7d-3a8f2a1f8c1e/b/",
    "https://api.example/v10/oauth2/x",
    "https://api.example",
    "not a url",
    "",
]


def test_masking_rules() -> None:
    assert masking.mask_text(TEXTS[0]) == "connection refused to <str> port <n> after <n> ms"
    assert masking.mask_text(TEXTS[1]) == "upstream <str> said <n> for request <uuid> at <hex>"
    assert masking.mask_text(TEXTS[2]) == "lock <hex> held by worker w3 for <n> s"
    assert masking.mask_text(TEXTS[4]) == "charge <id> failed; retry in 30s"
    assert masking.mask_endpoint(URLS[0]) == "api.payments.example/v1/charges/{id}/capture"
    assert masking.mask_endpoint(URLS[1]) == "inventory.internal:8443/v2/items/{id}"
    assert masking.mask_endpoint(URLS[2]) == "host.example/a/{id}/b/"
    assert masking.mask_endpoint(URLS[3]) == "api.example/v10/oauth2/x"
    assert masking.mask_endpoint(URLS[4]) == "api.example/"
    assert masking.mask_endpoint(URLS[5]) == ""


def test_masking_is_the_same_in_spark_sql(spark: Any) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(t, u) for t in TEXTS for u in URLS], "text string, url string")
    got = frame.select(
        "text",
        "url",
        masking.spark_mask_text(F.col("text")).alias("t"),
        masking.spark_mask_endpoint(F.col("url")).alias("u"),
    ).collect()
    for row in got:
        assert row.t == masking.mask_text(row.text), row.text
        assert row.u == masking.mask_endpoint(row.url), row.url


def test_drain_merges_variable_tokens() -> None:
    templates = templates_for(
        {
            "timeout after <n> ms waiting for lock <hex>": 5,
            "timeout after <n> ms waiting for lock <n>": 1,
            "timeout after <n> ms waiting for row <hex>": 2,
            "card_declined for order <n>: code <str>": 3,
            "outbound call failed": 9,
        }
    )
    assert (
        templates["timeout after <n> ms waiting for lock <n>"]
        == f"timeout after <n> ms waiting for {WILDCARD} {WILDCARD}"
    )
    assert templates["card_declined for order <n>: code <str>"] == "card_declined for order <n>: code <str>"
    assert templates["outbound call failed"] == "outbound call failed"


def _row(record: dict[str, Any]) -> dict[str, Any]:
    request = record.get("request") or {}
    response = record.get("response") or {}
    return {
        **record,
        "method": request.get("method"),
        "url": request.get("url"),
        "status": response.get("status"),
    }


def test_errors_job_groups_the_known_failures(spark: Any, spark_sample: SampleIndex, tmp_path: Path) -> None:
    index = tmp_path / "index"
    import shutil

    shutil.copytree(spark_sample.index, index)
    report = run_errors(spark, index, windows=(60,))
    rows = [_row(r) for r in read_records(spark_sample.wirelog, include_open=False)]
    failures = [r for r in rows if masking.is_failure(r)]
    expected = Counter(masking.signature(r) for r in failures)
    assert {s["signature"]: s["count"] for s in report.signatures} == dict(expected)
    assert report.failures == len(failures) > 0
    by_signature = {s["signature"]: s for s in report.signatures}
    payments = by_signature["http POST api.payments.example/v1/charges/{id}/capture 5xx"]
    matching = [r for r in failures if masking.signature(r) == payments["signature"]]
    assert payments["first_seen"] == min(r["ts"] for r in matching)
    assert payments["last_seen"] == max(r["ts"] for r in matching)
    assert payments["groups"] == len({r["group"] for r in matching})
    latest = sorted(matching, key=lambda r: -r["ts"])
    assert payments["exemplars"][0] == latest[0]["message_id"]
    assert len(set(payments["exemplars"])) == len(payments["exemplars"]) == 3
    assert (
        "http POST db-gateway.internal/query error connection refused to <str> port <n> after <n> ms"
        in by_signature
    )
    assert any(
        s["signature"].startswith("log failed card_declined for order <n>: code <str>")
        for s in report.signatures
    )
    assert any(t["template"] == "connection refused to <str> port <n> after <n> ms" for t in report.templates)
    assert (index / "errors" / "errors.json").exists()
    assert sum(w["count"] for w in report.windows[60]) == len(failures)


def test_alert_rules_fire_into_the_wire_log(spark: Any, spark_sample: SampleIndex, tmp_path: Path) -> None:
    import shutil

    index, wirelog = tmp_path / "index", tmp_path / "wirelog"
    shutil.copytree(spark_sample.index, index)
    config = tmp_path / "alerts.toml"
    config.write_text(
        """
[[alerts.rule]]
name = "payments-5xx"
signature = "http POST api.payments.example/* 5xx*"
threshold = 3
window = "1m"
severity = "page"

[[alerts.rule]]
name = "never"
template = "nothing like this*"
threshold = 1
window = "5m"
"""
    )
    rules = load_rules(config)
    report = run_errors(spark, index, windows=tuple(r.window for r in rules))
    alerts = evaluate(rules, report)
    assert alerts and {a.rule.name for a in alerts} == {"payments-5xx"}
    assert all(a.count >= 3 and a.window_end - a.window_start == 60 for a in alerts)
    fresh = emit(alerts, index_dir=index, wirelog_dir=wirelog)
    assert fresh == alerts
    events = list(read_records(wirelog, where=RecordFilter(kind="event")))
    assert [e["event"] for e in events] == ["alert"] * len(alerts)
    assert events[0]["writer"] == "spark-alerts" and events[0]["alert"]["rule"] == "payments-5xx"
    assert events[0]["alert"]["severity"] == "page" and events[0]["alert"]["count"] == alerts[0].count
    assert emit(alerts, index_dir=index, wirelog_dir=wirelog) == []  # already emitted: not repeated
    assert len(list(read_records(wirelog, where=RecordFilter(kind="event")))) == len(alerts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[alerts.rule]]\nname='a'\nthreshold=1\nwindow='5m'\n", "exactly one of"),
        (
            "[[alerts.rule]]\nname='a'\nsignature='x'\ntemplate='y'\nthreshold=1\nwindow='5m'\n",
            "exactly one of",
        ),
        ("[[alerts.rule]]\nname='a'\nsignature='x'\nthreshold=0\nwindow='5m'\n", "threshold"),
        ("[[alerts.rule]]\nname='a'\nsignature='x'\nthreshold=1\nwindow='soon'\n", "window"),
        ("[[alerts.rule]]\nname='a'\nsignature='x'\nthreshold=1\nwindow='5m'\ncolour='red'\n", "unknown key"),
        ("[[alerts.rule]]\nsignature='x'\nthreshold=1\nwindow='5m'\n", "name"),
        ("nothing = 1\n", "no [[alerts.rule]]"),
        ("[[alerts.rule]\n", "alerts.toml"),
    ],
)
def test_bad_alert_rules_are_refused(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "alerts.toml"
    config.write_text(text)
    with pytest.raises(AlertConfigError, match=message.replace("[", r"\[")):
        load_rules(config)
