"""Wire-log record schema v1: the line codec, compat, body fields and builders (no files involved)."""

from __future__ import annotations

import base64
import hashlib

import orjson
import pytest

from wirelog import record as rec
from wirelog.errors import RecordError, TornLine, UnknownVersion, WireLogError
from wirelog.record import (
    ACTIONS,
    KINDS,
    SCHEMA_VERSION,
    LineSplitter,
    body_bytes_of,
    body_fields,
    compat,
    decode_line,
    delivery_record,
    encode,
    event_record,
    header_block,
    header_text,
    http_record,
    http_request,
    http_response,
    log_record,
)


def test_constants_match_the_design_note() -> None:
    assert SCHEMA_VERSION == 1
    assert KINDS == ("http", "delivery", "log", "event")
    assert ACTIONS == ("pass", "block", "mimic", "stale-lease", "unsynced", "unmatched")


def test_encode_is_one_line_and_round_trips() -> None:
    record = {
        "v": 1,
        "kind": "log",
        "reason": "line one\nline two\r\u2028",
        "steps": [1, {"é": None}],
        "x": 1.5,
    }
    line = encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # newlines inside strings are escaped
    assert decode_line(line) == record
    assert decode_line(line.rstrip(b"\n")) == record  # with or without the newline


def test_encode_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(RecordError):
        encode({"v": 1, "kind": "log", "bad": object()})
    with pytest.raises(RecordError):
        encode({1: "non-str key"})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "line",
    [b"not json", b"[1, 2]", b'"text"', b"{}", b'{"v": "1"}', b'{"v": true}', b'{"v": 1.0}', b"", b'{"v": 1'],
)
def test_decode_line_rejects_non_records(line: bytes) -> None:
    with pytest.raises(RecordError) as info:
        decode_line(line)
    assert isinstance(info.value, WireLogError) and isinstance(info.value, ValueError)


def test_error_family() -> None:
    for error in (RecordError, TornLine, UnknownVersion):
        assert issubclass(error, WireLogError)
    assert issubclass(TornLine, RecordError) and issubclass(UnknownVersion, RecordError)
    assert TornLine(12).size == 12 and UnknownVersion(7).version == 7


def test_compat_is_identity_for_v1_and_refuses_unknown_versions() -> None:
    record = {"v": 1, "kind": "event", "event": "x"}
    assert compat(record) is record
    for version in (0, 2, 99, -1, "1", None, True):
        with pytest.raises(UnknownVersion):
            compat({"v": version, "kind": "event"})


def test_compat_upgrades_through_registered_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism v2 will use: readers keep calling compat and get the current shape."""
    monkeypatch.setattr(rec, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(rec, "_UPGRADES", {1: lambda r: {**r, "a": 1}, 2: lambda r: {**r, "b": r["a"] + 1}})
    assert rec.compat({"v": 1, "kind": "log"}) == {"v": 3, "kind": "log", "a": 1, "b": 2, "request_id": None}
    assert rec.compat({"v": 3, "kind": "log"}) == {"v": 3, "kind": "log", "request_id": None}
    monkeypatch.setattr(rec, "_UPGRADES", {2: lambda r: r})
    with pytest.raises(UnknownVersion):  # no step from v1: cannot be read
        rec.compat({"v": 1})


def test_body_fields_text_binary_and_absent() -> None:
    text = body_fields(b'{"a": "\xc3\xa9"}')
    assert text == {
        "body": '{"a": "é"}',
        "body_b64": None,
        "body_sha256": hashlib.sha256(b'{"a": "\xc3\xa9"}').hexdigest(),
        "body_bytes": 11,
    }
    binary = body_fields(b"\xff\x00\x01", prefix="response_")
    assert binary["response_body"] is None
    assert base64.b64decode(binary["response_body_b64"]) == b"\xff\x00\x01"
    assert binary["response_body_bytes"] == 3
    assert body_fields(None) == {"body": None, "body_b64": None, "body_sha256": None, "body_bytes": None}
    empty = body_fields(b"")
    assert (
        empty["body"] == ""
        and empty["body_bytes"] == 0
        and empty["body_sha256"] == hashlib.sha256().hexdigest()
    )


def test_body_fields_metadata_and_size_cap_keep_hash_and_size() -> None:
    for fields in (body_fields(b"secret-free body", keep=False), body_fields(b"x" * 100, max_bytes=99)):
        assert fields["body"] is None and fields["body_b64"] is None
        assert fields["body_sha256"] and fields["body_bytes"] > 0
    assert body_fields(b"x" * 99, max_bytes=99)["body"] == "x" * 99


def test_body_bytes_of_inverts_body_fields() -> None:
    for data in (b"plain", b"\x80\x81binary", b""):
        assert body_bytes_of(body_fields(data)) == data
    assert body_bytes_of(body_fields(b"x", keep=False)) is None


def test_header_helpers() -> None:
    assert header_text(b"caf\xc3\xa9") == "café"
    assert header_text(b"\xff\xfe") == "\xff\xfe"  # not UTF-8: Latin-1, lossless
    assert header_text("ok") == "ok"
    assert header_text(b"caf\xff".decode("utf-8", "surrogateescape")) == "caf\xff"  # mitmproxy-style str
    block = header_block([["Host", "a"], ["X", "é"]])
    raw = "Host: a\r\nX: é\r\n".encode()
    assert block == {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def test_http_record_has_every_schema_field() -> None:
    record = http_record(
        request=http_request(method="POST", url="https://api.example/x", headers=[["A", "b"]], body=b"hi"),
        response=http_response(
            status=201, headers=None, headers_omitted={"bytes": 1, "sha256": "00"}, body=None
        ),
        latency_ms=3.5,
        worker="w1",
        queue="orders",
        message_id="m1",
        group="g1",
        lease=7,
        attempt=1,
        call=2,
    )
    assert set(record) == {
        "v", "kind", "ts", "worker", "queue", "message_id", "group", "lease", "attempt", "call",
        "request_id", "request", "response", "error", "latency_ms", "action", "replayed_from",
    }  # fmt: skip
    assert set(record["request"]) == {
        "method", "url", "headers", "headers_omitted", "body", "body_b64", "body_sha256", "body_bytes"
    }  # fmt: skip
    assert record["response"]["status"] == 201 and record["response"]["headers"] is None
    assert record["action"] == "pass" and record["kind"] == "http"
    assert decode_line(encode(record)) == record
    with pytest.raises(RecordError):
        http_record(request={}, response=None, action="allow")


def test_other_builders() -> None:
    delivery = delivery_record(
        queue="q", message_id="m", group="g", body=b"payload", attributes={"a": "1"}, seq=4, receive_count=2
    )
    assert delivery["kind"] == "delivery" and delivery["body"] == "payload" and delivery["seq"] == 4
    assert delivery["attributes"] == {"a": "1"} and delivery["receive_count"] == 2
    log = log_record(outcome="failed", reason="timeout", steps=["charged"], partial={"n": 1}, message_id="m")
    assert (log["kind"], log["outcome"], log["steps"], log["partial"]) == (
        "log",
        "failed",
        ["charged"],
        {"n": 1},
    )
    event = event_record(event="fenced", reason="operator", worker="w1")
    assert (event["kind"], event["event"], event["worker"]) == ("event", "fenced", "w1")
    for built in (delivery, log, event):
        assert built["v"] == 1 and "ts" in built


# ---------------------------------------------------------------------------------- line splitter
def test_line_splitter_joins_lines_across_chunks() -> None:
    lines = [encode({"v": 1, "kind": "log", "n": i, "pad": "x" * i}) for i in range(50)]
    data = b"".join(lines)
    for size in (1, 3, 7, 64, len(data)):
        splitter = LineSplitter()
        out: list[bytes] = []
        for start in range(0, len(data), size):
            out.extend(splitter.feed(data[start : start + size]))
        splitter.finish()
        assert out == [line.rstrip(b"\n") for line in lines]


def test_line_splitter_reports_a_torn_tail() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'{"v":1}\n{"v":1,"kind"') == [b'{"v":1}']
    assert splitter.pending == len(b'{"v":1,"kind"')
    with pytest.raises(TornLine) as info:
        splitter.finish()
    assert info.value.size == len(b'{"v":1,"kind"')
    splitter.finish()  # the tail is gone after it was reported


def test_line_splitter_skips_oversized_lines_with_bounded_memory() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    out = splitter.feed(b"short\n" + b"y" * 8)
    out += splitter.feed(b"y" * 30)  # now over the limit: dropped, not accumulated
    assert splitter.pending == 0
    out += splitter.feed(b"yyy\nok\n" + b"z" * 25 + b"\nfine\n")
    splitter.finish()
    assert out == [b"short", b"ok", b"fine"]
    assert splitter.oversized == 2


def test_records_are_orjson_compatible_for_spark() -> None:
    """Plain JSON: any JSON reader (Spark's included) reads the same values back."""
    line = encode(event_record(event="x", ts=1795330897.25))
    assert orjson.loads(line)["ts"] == 1795330897.25
