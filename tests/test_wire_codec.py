"""The internal API's one codec (queue_core.wire): every form round-trips through real JSON bytes,
decode(encode(x)) == x, for what the server writes and the remote backend and client read, and for what
they send and the server reads (with its checks on)."""

from __future__ import annotations

import string
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_core import wire
from queue_core.machine import (
    AckOutcome,
    Delivery,
    InvalidArgument,
    MoveStatus,
    NotFound,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    SendRequest,
    SendResult,
    StaleClaim,
    TooLarge,
)
from queue_core.machine.capabilities import PLAIN, SDK, Capabilities
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.records import Received, ReportOutcome, format_receipt

SETTINGS = settings(max_examples=150, deadline=None)

names = st.text(string.ascii_letters + string.digits + "-_.:", min_size=1, max_size=40)
queue_names = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=40)
hex_ids = st.integers(1, (1 << 63) - 1).map(lambda n: f"{n:016x}")
message_ids = st.one_of(names, hex_ids)
tokens = st.integers(1, (1 << 63) - 1)
finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 53), 1 << 53), names)
json_objects = st.dictionaries(names, json_scalars, min_size=1, max_size=4)
extras = st.one_of(st.just(b""), json_objects.map(orjson.dumps))


def over_the_wire(data: Any) -> Any:
    """What the peer reads: the form serialised and parsed back, as the HTTP body carries it."""
    return orjson.loads(orjson.dumps(data))


# ------------------------------------------------------------------------------------------- sends
send_requests = st.builds(
    SendRequest,
    body=st.binary(max_size=64),
    group=st.none() | names,
    dedup_id=st.none() | names,
    message_id=st.none() | message_ids,
    delay=st.none() | st.floats(0, 900, allow_nan=False),
    content_type=names,
    extra=extras,
)


@SETTINGS
@given(send_requests)
def test_a_send_request_round_trips(request: SendRequest) -> None:
    assert wire.decode_send_request(over_the_wire(wire.encode_send_request(request))) == request


@SETTINGS
@given(st.lists(send_requests, min_size=1, max_size=5), st.booleans())
def test_a_send_batch_round_trips(requests: list[SendRequest], create: bool) -> None:
    assert wire.decode_send(over_the_wire(wire.encode_send(requests, create))) == (requests, create)


@SETTINGS
@given(
    st.builds(SendResult, message_ids, names, st.integers(0, 1 << 40), st.integers(0, 1023), st.booleans())
)
def test_a_send_result_round_trips(result: SendResult) -> None:
    assert wire.decode_send_result(over_the_wire(wire.encode_send_result(result))) == result


@SETTINGS
@given(st.sampled_from([InvalidArgument, TooLarge, NotFound, StaleClaim]), names, names)
def test_a_refused_entry_round_trips_as_the_same_error(
    cls: type[QueueError], message: str, field: str
) -> None:
    error = cls(message, field=field)
    back = wire.decode_send_result(over_the_wire(wire.encode_send_result(error)))
    assert isinstance(back, QueueError)
    assert (type(back), back.code, back.message, back.to_dict()) == (
        cls,
        error.code,
        message,
        error.to_dict(),
    )


def test_a_bad_send_entry_is_its_own_error_and_the_rest_go_on() -> None:
    parsed, create = wire.decode_send({"messages": [{"body": "ok"}, {"body_b64": "%%"}, 7]})
    assert create is False
    assert isinstance(parsed[0], SendRequest) and parsed[0].body == b"ok"
    assert [getattr(p, "details", {}).get("field") for p in parsed[1:]] == ["body_b64", None]


# ----------------------------------------------------------------------------------------- receive
capabilities = st.sampled_from([PLAIN, SDK, Capabilities(results=True)])
receive_requests = st.builds(
    wire.ReceiveRequest,
    limit=st.integers(1, 1000),
    ttl=st.none() | st.floats(0, 43200, allow_nan=False),
    worker=st.just("") | names,
    wait=st.floats(0, 20, allow_nan=False),
    probes=st.booleans(),
    capabilities=capabilities,
)


@SETTINGS
@given(receive_requests)
def test_a_receive_request_round_trips(request: wire.ReceiveRequest) -> None:
    assert wire.decode_receive(over_the_wire(wire.encode_receive(request))) == request


@st.composite
def received_items(draw: st.DrawFn) -> Received:
    message_id = draw(message_ids)
    token = draw(tokens)
    delivery = Delivery(
        key=wire.key_of(message_id),
        message_id=message_id,
        group=draw(names),
        seq=draw(st.integers(0, 1 << 40)),
        token=token,
        receipt=format_receipt(token, message_id),
        receive_count=draw(st.integers(1, 1000)),
        sent_at=draw(finite),
        first_receive_at=draw(finite),
        claim_expires=draw(finite),
        origin=draw(st.none() | names),
        history=draw(st.none() | json_objects),
    )
    return Received(delivery, draw(st.binary(max_size=64)), draw(names), draw(extras), draw(st.booleans()))


@SETTINGS
@given(received_items())
def test_a_received_item_round_trips(item: Received) -> None:
    assert wire.decode_received(over_the_wire(wire.encode_received(item))) == item


# ------------------------------------------------------------------------------ claims, outcomes
claim_items = st.lists(st.tuples(message_ids, st.none() | tokens), min_size=1, max_size=10)


@SETTINGS
@given(claim_items, st.none() | names)
def test_claim_items_and_their_holder_round_trip(
    items: list[tuple[str, int | None]], holder: str | None
) -> None:
    data = over_the_wire(wire.encode_claims(items, holder, ttl=30.0, mode="set"))
    assert (wire.decode_claims(data), wire.holder_of(data)) == (items, holder)
    assert (data["ttl"], data["mode"]) == (30.0, "set")


@SETTINGS
@given(
    st.builds(AckOutcome, message_ids, st.sampled_from(["ok", "gone", "stale_claim", "not_in_flight"]), names)
)
def test_an_ack_outcome_round_trips(outcome: AckOutcome) -> None:
    assert wire.decode_ack_outcome(over_the_wire(wire.encode_outcome(outcome))) == outcome


@SETTINGS
@given(
    st.builds(
        ReportOutcome,
        message_ids,
        st.sampled_from(["ok", "gone", "stale_claim", "out_of_order"]),
        st.just("") | names,
        names,
        st.integers(1, 1000),
    )
)
def test_a_report_outcome_round_trips(outcome: ReportOutcome) -> None:
    assert wire.decode_report_outcome(over_the_wire(wire.encode_outcome(outcome))) == outcome


results = st.builds(
    AttemptResult,
    message_id=message_ids,
    token=tokens,
    outcome=st.sampled_from(["succeeded", "failed", "partial", "not_attempted"]),
    reason=st.just("") | names,
    signature=st.just("") | names,
    steps=st.lists(st.builds(lambda n: {"name": n}, names), max_size=3),
    partial=st.none() | json_objects,
    fields=st.none() | json_objects,
    duration_ms=st.none() | st.floats(0, 1e6, allow_nan=False),
)


@SETTINGS
@given(names, st.lists(results, min_size=1, max_size=5, unique_by=lambda r: r.message_id), st.none() | names)
def test_a_report_round_trips(worker: str, reported: list[AttemptResult], holder: str | None) -> None:
    assert wire.decode_report(over_the_wire(wire.encode_report(worker, reported, holder))) == (
        worker,
        reported,
        holder,
    )


# -------------------------------------------------------------------------- queues, metrics, moves
attributes = st.builds(
    lambda vt, mrc, dlq, kind: QueueAttributes.from_dict(
        {"visibility_timeout": vt, "max_receive_count": mrc, "dead_letter_queue": dlq, "kind": kind}
    ),
    st.integers(0, 43200).map(float),
    st.integers(0, 1000),
    st.none() | queue_names,
    st.sampled_from(["queue", "dedup"]),
)
metrics = st.builds(
    QueueMetrics,
    names,
    *[st.integers(0, 1 << 40)] * 5,
    finite,
    finite,
    *[st.integers(0, 1 << 40)] * 4,
)


@SETTINGS
@given(names, attributes, metrics, finite)
def test_queue_info_round_trips(
    name: str, attrs: QueueAttributes, queue_metrics: QueueMetrics, at: float
) -> None:
    info = wire.QueueInfo(name, attrs, queue_metrics, at)
    assert wire.decode_queue_info(over_the_wire(wire.encode_queue_info(info))) == info
    assert wire.decode_attributes(over_the_wire(wire.encode_queue(name, attrs))) == attrs
    assert wire.decode_metrics(over_the_wire(wire.encode_metrics(queue_metrics))) == queue_metrics


@st.composite
def peeked(draw: st.DrawFn) -> tuple[PeekItem, bytes, str, bytes]:
    message_id = draw(message_ids)
    item = PeekItem(
        wire.key_of(message_id),
        message_id,
        draw(names),
        draw(st.integers(0, 1 << 40)),
        draw(finite),
        draw(st.integers(0, 1000)),
        draw(st.booleans()),
    )
    return item, draw(st.binary(max_size=64)), draw(names), draw(extras)


@SETTINGS
@given(peeked())
def test_a_peek_item_round_trips(item: tuple[PeekItem, bytes, str, bytes]) -> None:
    assert wire.decode_peek(over_the_wire(wire.encode_peek(*item))) == item


moves = st.builds(
    MoveStatus,
    id=names,
    source=names,
    destination=names,
    moved=st.integers(0, 1 << 40),
    remaining=st.integers(0, 1 << 40),
    state=st.sampled_from(["running", "done", "failed", "cancelled"]),
    error=st.just("") | names,
    started_at=finite,
    finished_at=finite,
)


@SETTINGS
@given(moves, names, names)
def test_a_move_and_its_request_round_trip(move: MoveStatus, source: str, destination: str) -> None:
    assert wire.decode_move(over_the_wire(wire.encode_move(move))) == move
    assert wire.decode_move_request(over_the_wire(wire.encode_move_request(source, destination))) == (
        source,
        destination,
        None,
    )
    with_id = wire.encode_move_request(source, destination, "mv-c" + source)
    assert wire.decode_move_request(over_the_wire(with_id)) == (source, destination, "mv-c" + source)
