"""The delivery log's `delivery` and `event` records are exactly what wirelog.record's builders give plus
the gateway's own fields (tenant, face, ...), key order included, so the bytes on disk stay as readers
expect."""

from __future__ import annotations

from pathlib import Path

import orjson

from access.keys import Credential, Role
from gateway.deliveries import DeliveryLog
from queue_core.machine.records import AckOutcome, Delivery, Received
from wirelog.reader import read_records
from wirelog.record import delivery_record, event_record


def _received(body: bytes, content_type: str, extra: bytes = b"") -> Received:
    delivery = Delivery(
        key=1, message_id="m-1", group="g", seq=5, token=9, receipt="r", receive_count=2,
        sent_at=0.0, first_receive_at=0.0, claim_expires=0.0,
    )  # fmt: skip
    return Received(delivery=delivery, body=body, content_type=content_type, extra=extra, request_id="req-1")


def test_records_are_the_builders_records(tmp_path: Path) -> None:
    log = DeliveryLog(tmp_path / "wirelog", key_dir=tmp_path, compress=False)
    credential = Credential(id="worker-1", secret="s", role=next(iter(Role)), tenant="t1")
    attributes = {"color": {"DataType": "String", "StringValue": "red"}}
    extra = orjson.dumps({"sqs": {"attributes": attributes}})
    items = [
        _received(b'{"x": 1}', "application/json"),
        _received(b'{"password": "hunter2"}', "application/json", extra),
        _received(b"\xff\xfe binary", ""),
    ]
    log.delivered(credential, "emodb", "q", items)
    log.ended(credential, "emodb", "q", "ack", [("m-1", 9), ("m-2", 3)], [
        AckOutcome("m-1", "ok"), AckOutcome("m-2", "gone"),
    ])  # fmt: skip
    log.flush()
    written = list(read_records(tmp_path / "wirelog"))
    log.writer.close()
    assert [r["kind"] for r in written] == ["delivery"] * 3 + ["event"]
    for record, item in zip(written, items, strict=False):
        shown = log.redactor.body(item.content_type or None, item.body)
        expected = delivery_record(
            queue="q", message_id="m-1", group="g", body=shown, attributes=log._attributes(item.extra),
            seq=5, receive_count=2, ts=record["ts"], worker="worker-1", lease=9, attempt=2,
            request_id="req-1",
        )  # fmt: skip
        expected.update(tenant="t1", face="emodb", content_type=item.content_type or None)
        expected["body_redacted"] = shown != item.body
        got = {k: v for k, v in record.items() if k not in ("id", "writer")}
        assert list(got) == list(expected) and got == expected
    assert written[1]["body_redacted"] and written[1]["attributes"] == attributes
    event = event_record(
        event="ack", ts=written[3]["ts"], worker="worker-1", queue="q", message_id="m-1", lease=9
    )
    event.update(tenant="t1", face="emodb", position=0)
    got = {k: v for k, v in written[3].items() if k not in ("id", "writer")}
    assert list(got) == list(event) and got == event
