"""How replay reads a message's story from wire-log records and compares two stories (fencing.replay.stories,
fencing.replay.compare), and the canary hook. The end-to-end runs are in test_replay_cli.py; these pin the
rules on small inputs built with wirelog's own builders."""

from __future__ import annotations

from typing import Any

from fencing.replay.canary import CanaryStage, compare_live, evaluate, in_canary
from fencing.replay.compare import compare_calls, compare_message
from fencing.replay.masking import MaskConfig, Masker
from fencing.replay.stories import CallRecord, Selection, StoryBuilder
from wirelog.record import (
    body_fields,
    delivery_record,
    event_record,
    http_record,
    http_request,
    http_response,
    log_record,
)


def delivery(
    message_id: str, attempt: int, lease: int, ts: float, body: bytes = b'{"n": 1}'
) -> dict[str, Any]:
    record = delivery_record(
        queue="orders", message_id=message_id, group="g", body=body, seq=1, receive_count=attempt,
        ts=ts, worker="w", lease=lease, attempt=attempt,
    )  # fmt: skip
    record.update(id=f"d-{message_id}-{attempt}", tenant="t1", face="emodb", content_type="application/json")
    return record


def event(name: str, message_id: str, lease: int | None, ts: float, position: int = 0) -> dict[str, Any]:
    record = event_record(event=name, queue="orders", message_id=message_id, lease=lease, ts=ts)
    record.update(id=f"e-{message_id}-{ts}", position=position)
    return record


def call(
    message_id: str, lease: int, ordinal: int, path: str, body: bytes = b"", ts: float = 0.0
) -> dict[str, Any]:
    record = http_record(
        request=http_request(method="POST", url=f"http://api.test:8080{path}", headers=[], body=body),
        response=http_response(status=200, headers=[], body=b"{}"),
        message_id=message_id, lease=lease, attempt=1, call=ordinal, queue="orders", group="g", ts=ts,
    )  # fmt: skip
    record["id"] = f"c-{message_id}-{lease}-{ordinal}"
    return record


def build(*records: dict[str, Any], masker: Masker | None = None) -> dict[str, Any]:
    builder = StoryBuilder(masker)
    for record in records:
        builder.add(record)
    return builder.stories()


def test_attempt_outcomes_from_the_gateways_events() -> None:
    stories = build(
        delivery("m1", 1, 11, 1.0),
        event("release", "m1", 11, 1.5),
        delivery("m1", 2, 12, 2.0),
        event("ack", "m1", 12, 2.4),
        delivery("m2", 1, 21, 1.0),  # its claim ran out: delivered again
        delivery("m2", 2, 22, 40.0),
        event("ack", "m2", None, 41.0),  # without a token: the latest delivery's
        delivery("m3", 1, 31, 1.0),
    )
    m1, m2, m3 = stories["m1"], stories["m2"], stories["m3"]
    assert [(a.outcome, a.latency_ms) for a in m1.processed] == [("fail", 500.0), ("ack", 400.0)]
    assert [a.outcome for a in m2.processed] == ["timeout", "ack"]
    assert m2.processed[0].reason == "claim expired (delivered again)"
    assert m3.processed[0].outcome == "timeout" and m3.processed[0].reason == "no ack or release recorded"
    assert m1.body == b'{"n": 1}' and m1.body_problem is None and m1.tenant == "t1"


def result(outcome: str, message_id: str, lease: int, ts: float, status: str = "ok") -> dict[str, Any]:
    """A reported attempt result as the gateway's results route logs it (kind `log`)."""
    record = log_record(
        outcome=outcome, reason="card declined", queue="orders", message_id=message_id, lease=lease, ts=ts
    )
    record.update(id=f"l-{message_id}-{ts}", status=status)
    return record


def test_reported_attempt_results_are_outcomes_too() -> None:
    stories = build(
        delivery("a", 1, 1, 1.0),
        result("failed", "a", 1, 1.2),
        delivery("a", 2, 2, 3.0),
        result("succeeded", "a", 2, 3.1, status="stale_claim"),  # refused: changes nothing
        result("succeeded", "a", 2, 3.2),
        delivery("b", 1, 1, 1.0),
        result("not_attempted", "b", 1, 1.2),
        delivery("b", 1, 3, 4.0),
        result("partial", "b", 3, 4.5),
    )
    assert [(a.outcome, a.ended_at) for a in stories["a"].processed] == [("fail", 1.2), ("ack", 3.2)]
    assert stories["a"].processed[0].reason == "reported failed: card declined"
    assert [(a.lease, a.outcome) for a in stories["b"].processed] == [(3, "fail")]


def test_handed_back_deliveries_are_not_processing_attempts() -> None:
    stories = build(
        delivery("head", 1, 5, 1.0),
        delivery("next", 1, 5, 1.0),  # claimed with it, never started
        call("head", 5, 1, "/charge", ts=1.1),
        event("release", "head", 5, 1.2, position=0),
        event("release", "next", 5, 1.2, position=1),
        delivery("next", 2, 6, 2.0),
        event("ack", "next", 6, 2.1),
    )
    assert [a.outcome for a in stories["head"].processed] == ["fail"]
    assert [(a.number, a.outcome) for a in stories["next"].processed] == [(2, "ack")]


def test_bodies_that_cannot_be_rebuilt() -> None:
    redacted = delivery("r", 1, 1, 1.0)
    redacted["body_redacted"] = True
    metadata = delivery("m", 1, 2, 1.0)
    metadata.update(body_fields(b'{"n": 1}', keep=False))
    stories = build(redacted, metadata, call("orphan", 3, 1, "/x"))
    assert "redacted" in (stories["r"].body_problem or "")
    assert "not recorded" in (stories["m"].body_problem or "")
    assert "no delivery record" in (stories["orphan"].body_problem or "")


def test_selection_by_queue_group_time_and_outcome() -> None:
    stories = build(
        delivery("a", 1, 1, 10.0),
        event("ack", "a", 1, 11.0),
        delivery("b", 1, 2, 20.0),
        event("release", "b", 2, 21.0),
    ).values()
    assert [s.message_id for s in Selection().select(stories)] == ["a", "b"]
    assert [s.message_id for s in Selection(outcome="fail").select(stories)] == ["b"]
    assert [s.message_id for s in Selection(since=15.0).select(stories)] == ["b"]
    assert [s.message_id for s in Selection(until=15.0, queues=("orders",)).select(stories)] == ["a"]
    assert Selection(groups=("other",)).select(stories) == []
    assert "outcome fail" in Selection(outcome="fail").describe()


def calls(*specs: tuple[str, str]) -> list[CallRecord]:
    return [
        CallRecord(i, "POST", "api.test", path, f"sha-{body}", body, 200, "mimic", f"r{i}", 1.0, float(i))
        for i, (path, body) in enumerate(specs, 1)
    ]


def test_call_sequence_differences() -> None:
    a, b, c = ("/a", '{"x": 1}'), ("/b", "{}"), ("/c", "{}")
    assert compare_calls(1, calls(a, b, c), calls(a, b, c)) == []
    changed = compare_calls(1, calls(a, b), calls(("/a", '{"x": 2}'), b))
    assert [(d.kind, d.call) for d in changed] == [("call-changed", 1)]
    assert (
        changed[0].detail is not None
        and '-  "x": 1' in changed[0].detail
        and '+  "x": 2' in changed[0].detail
    )
    assert [(d.kind, d.call) for d in compare_calls(1, calls(a, b), calls(a, b, c))] == [("call-added", 3)]
    assert [(d.kind, d.call) for d in compare_calls(1, calls(a, b, c), calls(a, c))] == [("call-removed", 2)]
    swapped = compare_calls(1, calls(a, b, c), calls(b, a, c))
    assert [(d.kind, d.call) for d in swapped] == [("calls-swapped", 1)]
    replaced = compare_calls(1, calls(a, b), calls(a, c))
    assert [d.kind for d in replaced] == ["call-removed", "call-added"]


def test_message_comparison_outcome_unmatched_and_latency() -> None:
    reference = build(delivery("m", 1, 1, 1.0), call("m", 1, 1, "/a", ts=1.01), event("ack", "m", 1, 1.02))[
        "m"
    ]
    candidate = build(delivery("m", 1, 7, 5.0), call("m", 7, 1, "/a", ts=5.1), event("release", "m", 7, 5.5))[
        "m"
    ]
    candidate.processed[0].calls[0].action = "unmatched"
    result = compare_message(reference, candidate, max_slowdown=2.0)
    assert result.kinds == ["outcome", "unmatched", "latency"]
    assert result.first_difference is not None
    assert result.first_difference.startswith("attempt 1: outcome: reference ack, candidate fail")
    assert compare_message(reference, None).kinds == ["not-replayed"]
    assert not compare_message(reference, reference).diverged
    assert not compare_live(reference, reference).diverged


def test_masks_apply_when_stories_are_read() -> None:
    masker = Masker(MaskConfig(("$.at",)))
    one = build(delivery("m", 1, 1, 1.0), call("m", 1, 1, "/a", b'{"at": 1, "n": 1}'), masker=masker)["m"]
    two = build(delivery("m", 1, 2, 1.0), call("m", 2, 1, "/a", b'{"n": 1, "at": 2}'), masker=masker)["m"]
    assert one.processed[0].calls[0].key == two.processed[0].calls[0].key
    assert one.processed[0].calls[0].body == '{"at":"<masked>","n":1}'


def test_canary_hook() -> None:
    groups = [f"customer-{n}" for n in range(2000)]
    one = {g for g in groups if in_canary(g, 1.0)}
    two = {g for g in groups if in_canary(g, 2.0)}
    assert one < two and 5 <= len(one) <= 40 and not any(in_canary(g, 0) for g in groups)
    assert one == {g for g in groups if in_canary(g, 1.0)}  # stable
    stories = build(delivery("m", 1, 1, 1.0), event("ack", "m", 1, 1.1))
    same = [compare_live(stories["m"], stories["m"])] * 100
    stage = CanaryStage(1.0, 60.0)
    assert evaluate(same, stage, elapsed=10.0).decision == "hold"
    assert evaluate(same, stage, elapsed=61.0).decision == "promote"
    bad = compare_message(stories["m"], None)
    assert evaluate([*same, bad], stage, elapsed=61.0).decision == "rollback"
