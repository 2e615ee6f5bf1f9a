"""The index by request id (issue 17): `strictq search --request-id` finds the messages a send request
stored and tells their whole stories (records that do not carry the id included), and an index built from
records written before request ids existed reads them as having none. On the one shared SparkSession."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from spark_support import SampleIndex, brute_force

from spark.search import Query, QueryError, search
from wirelog.record import http_record, http_request, log_record
from wirelog.writer import WireLogWriter

ROOT = Path(__file__).resolve().parent.parent


def strictq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strictq", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_search_by_request_id_tells_the_stories_of_the_messages_it_sent(spark_sample: SampleIndex) -> None:
    traffic = spark_sample.traffic
    request_id = traffic.request_id_of(3)  # the sample sends three messages a request: 3, 4 and 5
    sent = set(traffic.message_ids[3:6])
    expected = [r for m in sorted(sent) for r in brute_force(spark_sample.wirelog, m)]

    result = search(spark_sample.index, Query(request_id=request_id))
    assert {row["message_id"] for row in result.rows} == sent
    assert sorted(row["id"] for row in result.rows) == sorted(r["id"] for r in expected)
    assert {row["request_id"] for row in result.rows} <= {request_id, None}

    done = strictq("search", "--index", str(spark_sample.index), "--request-id", request_id, "--json")
    assert done.returncode == 0, done.stderr
    document = orjson.loads(done.stdout)
    assert document["query"] == {"request_id": request_id}
    assert document["summary"]["messages"] == 3 and document["summary"]["request_ids"] == [request_id]
    assert len(document["records"]) == len(expected)

    text = strictq("search", "--index", str(spark_sample.index), "--request-id", request_id)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].startswith(f"request {request_id} · 3 message(s) · ")
    # with a message id too: that message's records of that request
    one = search(spark_sample.index, Query(request_id=request_id, message_id=traffic.message_ids[4]))
    assert {row["message_id"] for row in one.rows} == {traffic.message_ids[4]}

    nothing = strictq("search", "--index", str(spark_sample.index), "--request-id", "no-such-request")
    assert nothing.returncode == 1 and "no records match" in nothing.stderr
    bad = strictq("search", "--index", str(spark_sample.index), "--request-id", "two words")
    assert bad.returncode == 2 and "malformed request id" in bad.stderr
    try:
        search(spark_sample.index, Query(request_id="x" * 129))
    except QueryError as exc:
        assert "request id" in str(exc)
    else:
        raise AssertionError("an over-long request id was searched for")


def test_records_from_before_request_ids_are_indexed_as_without_one(spark: Any, tmp_path: Path) -> None:
    from spark.index import run_index

    request = http_request(method="GET", url="http://a/b", headers=None, body=None)
    older = http_record(request=request, response=None, message_id="m-old", ts=1_795_341_600.0)
    del older["request_id"]  # as a writer from before request ids wrote it
    newer = log_record(outcome="succeeded", message_id="m-new", ts=1_795_341_601.0, request_id="r-1")
    with WireLogWriter(tmp_path / "wirelog", "proxy-0", compress=True) as writer:
        writer.write(older)
        writer.write(newer)
    report = run_index(spark, tmp_path / "wirelog", tmp_path / "index", buckets=2)
    assert report.records == 2
    (old,) = search(tmp_path / "index", Query(message_id="m-old")).rows
    assert old["request_id"] is None and old["kind"] == "http"
    (new,) = search(tmp_path / "index", Query(request_id="r-1")).rows
    assert new["message_id"] == "m-new"
