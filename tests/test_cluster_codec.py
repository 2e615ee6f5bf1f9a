"""The replicated frame codec (cluster/codec.py): every durable effect survives encode/decode exactly (types
included: tuples stay tuples, ints stay ints, -0.0 stays -0.0), a standby store fed decoded frames holds the
same rows as the owner's, anything else is refused with CodecError, and split_effects keeps order and
bounds."""

from __future__ import annotations

import itertools
import math
import sqlite3
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import codec
from cluster.codec import (
    FORMAT_VERSION,
    CodecError,
    EffectsFrame,
    EpochMarker,
    decode_frame,
    encode_frame,
    split_effects,
)
from queue_core.machine.effects import (
    DURABLE_EFFECTS,
    AttemptLogged,
    AvailabilityChanged,
    BlacklistSaved,
    ClaimRow,
    ClaimsChanged,
    DedupSaved,
    Effect,
    FenceSaved,
    FleetControlSaved,
    FleetPolicySaved,
    FloorRaised,
    GroupEvent,
    GroupPolicySaved,
    HandoverSaved,
    HistorySaved,
    MessageInserted,
    MessagesClaimed,
    MessagesDeleted,
    MessagesMoved,
    ParticipationChanged,
    QueueDropped,
    QueuePurged,
    QueueSaved,
    ReceiveCountsRestored,
    SuspensionSaved,
    TokensRaised,
)
from queue_core.store import SqliteStore

# ------------------------------------------------------------------------------------------ strategies
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
floats = st.floats(allow_nan=False) | ints  # the machine may put an int where a float is declared
texts = st.text(max_size=20)
blobs = st.binary(max_size=64)
json_values = st.recursive(
    # st.integers(): beyond 64 bits too (they travel as a msgpack extension)
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)
keys = st.lists(ints, max_size=6).map(tuple)


def rows(*columns: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(st.tuples(*columns), max_size=5).map(tuple)


STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    QueueSaved: st.builds(QueueSaved, qid=ints, name=texts, attributes=json_objects, created_at=floats),
    QueueDropped: st.builds(QueueDropped, qid=ints),
    MessageInserted: st.builds(
        MessageInserted,
        qid=ints,
        key=ints,
        message_id=texts,
        group=texts,
        body=blobs,
        content_type=texts,
        extra=blobs,
        available_at=floats,
        digest=st.none() | blobs,
    ),
    DedupSaved: st.builds(
        DedupSaved, qid=ints, dedup_key=texts, message_id=texts, seq=ints, group=texts, expires_at=floats
    ),
    MessagesClaimed: st.builds(
        MessagesClaimed,
        claims=st.lists(
            st.builds(
                ClaimRow, key=ints, token=ints, expires=floats, receive_count=ints, first_receive_at=floats
            ),
            max_size=5,
        ).map(tuple),
        worker=texts,
    ),
    ClaimsChanged: st.builds(ClaimsChanged, changes=rows(ints, floats)),
    TokensRaised: st.builds(TokensRaised, keys=keys, token=ints),
    MessagesDeleted: st.builds(MessagesDeleted, keys=keys),
    MessagesMoved: st.one_of(
        st.builds(MessagesMoved, keys=keys, qid=ints, origin=st.none() | texts, redrive=st.booleans()),
        st.builds(MessagesMoved, keys=keys, qid=ints, origin=st.none() | texts),  # redrive's default
    ),
    QueuePurged: st.builds(QueuePurged, qid=ints),
    AttemptLogged: st.builds(
        AttemptLogged,
        qid=ints,
        group=texts,
        message_id=texts,
        worker=texts,
        attempt=ints,
        outcome=texts,
        reason=texts,
        signature=texts,
        steps=st.none() | st.lists(json_values, max_size=4),
        partial=json_values,
        fields=json_values,
        duration_ms=st.none() | floats,
        lease=ints,
        at=floats,
        keep=ints,
        expires=floats,
    ),
    HistorySaved: st.builds(HistorySaved, rows=rows(ints, ints, texts, st.none() | json_objects)),
    AvailabilityChanged: st.builds(AvailabilityChanged, rows=rows(ints, floats)),
    ReceiveCountsRestored: st.builds(ReceiveCountsRestored, rows=rows(ints, floats, ints, floats)),
    GroupPolicySaved: st.builds(GroupPolicySaved, qid=ints, group=texts, policy=st.none() | json_objects),
    ParticipationChanged: st.builds(
        ParticipationChanged, worker=texts, participates=st.booleans(), at=floats
    ),
    FenceSaved: st.builds(FenceSaved, worker=texts, fence=st.none() | json_objects),
    SuspensionSaved: st.builds(SuspensionSaved, queue=texts, state=st.none() | json_objects),
    BlacklistSaved: st.builds(BlacklistSaved, worker=texts, state=st.none() | json_objects),
    HandoverSaved: st.builds(HandoverSaved, qid=ints, group=texts, record=st.none() | json_objects),
    FleetControlSaved: st.builds(FleetControlSaved, control_id=texts, row=st.none() | json_objects),
    FleetPolicySaved: st.builds(FleetPolicySaved, queue=texts, policy=st.none() | json_objects),
}

any_effect = st.one_of(*STRATEGIES.values())


def typed(value: Any) -> Any:
    """`value` with every type spelled out: == alone takes (1,) for [1], 1 for 1.0 and 0.0 for -0.0."""
    if is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, tuple(typed(getattr(value, f.name)) for f in fields(value))
    if isinstance(value, list | tuple):
        return type(value).__name__, tuple(typed(item) for item in value)
    if isinstance(value, dict):
        return "dict", tuple((typed(k), typed(v)) for k, v in value.items())
    return type(value).__name__, repr(value)


# ------------------------------------------------------------------------------------------ the table
def test_table_covers_exactly_the_durable_effects() -> None:
    """A durable effect type added later without a row in the codec's table (or a strategy here) fails."""
    table = {spec.cls for spec in codec._TABLE}
    assert table == set(DURABLE_EFFECTS)
    assert set(STRATEGIES) == set(DURABLE_EFFECTS)
    numbers = [spec.number for spec in codec._TABLE]
    assert len(set(numbers)) == len(numbers), "a type number is used twice"
    for spec in codec._TABLE:  # every field of the dataclass travels
        assert spec.width == len(fields(spec.cls)), spec.cls.__name__


@pytest.mark.parametrize("effect", [FloorRaised("q", "g", 3), GroupEvent("q", "g", "park", "", "m", 1.0)])
def test_published_only_effects_are_refused(effect: Effect) -> None:
    with pytest.raises(CodecError, match="not a durable effect"):
        encode_frame(EffectsFrame((effect,)))
    with pytest.raises(CodecError, match="not a durable effect"):
        split_effects([effect], 1000)


# ---------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("cls", DURABLE_EFFECTS, ids=lambda cls: cls.__name__)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_every_durable_effect_round_trips_exactly(cls: type[Any], data: st.DataObject) -> None:
    effects = data.draw(st.lists(STRATEGIES[cls], min_size=1, max_size=3))
    frame = EffectsFrame(tuple(effects))
    decoded = decode_frame(encode_frame(frame))
    assert isinstance(decoded, EffectsFrame)
    assert decoded == frame
    assert typed(decoded.effects) == typed(frame.effects)


def test_nan_big_integers_and_bytes_survive() -> None:
    effect = AttemptLogged(
        1,
        "g",
        "m",
        "w",
        1,
        "failed",
        "r",
        "",
        [2**100, -(2**90)],
        {"x": math.nan},
        {1: b"\x00"},
        None,
        0,
        1.5,
        5,
        math.inf,
    )
    decoded = decode_frame(encode_frame(EffectsFrame((effect,))))
    assert isinstance(decoded, EffectsFrame)
    (back,) = decoded.effects
    assert isinstance(back, AttemptLogged)
    assert back.steps == [2**100, -(2**90)]
    assert math.isnan(back.partial["x"])
    assert back.fields == {1: b"\x00"}  # a non-str map key and bytes: kept as they are
    assert back.expires == math.inf


@given(epoch=st.integers(min_value=0, max_value=2**62), node=texts, incarnation=texts)
@settings(max_examples=50, deadline=None)
def test_epoch_marker_round_trips(epoch: int, node: str, incarnation: str) -> None:
    marker = EpochMarker(epoch, node, incarnation)
    assert decode_frame(encode_frame(marker)) == marker


def test_empty_effects_frame_round_trips() -> None:
    assert decode_frame(encode_frame(EffectsFrame(()))) == EffectsFrame(())


def test_values_msgpack_cannot_carry_are_refused_at_encode() -> None:
    unencodable: list[Effect] = [
        QueueSaved(1, "q", {"x": object()}, 0.0),
        QueueSaved(1, "bad \udcff surrogate", {}, 0.0),
        MessagesClaimed((("not", "a", "claim row"),), "w"),  # type: ignore[arg-type]
    ]
    for effect in unencodable:
        with pytest.raises(CodecError):
            encode_frame(EffectsFrame((effect,)))
        with pytest.raises(CodecError):
            split_effects([effect], 1 << 20)


# -------------------------------------------------------------------------------------- a real store
def store_effects() -> list[Effect]:
    """A commit history touching every table and every branch of SqliteStore._rows."""
    return [
        QueueSaved(1, "orders", {"FifoQueue": "true", "nested": {"a": [1, 2.5, None]}}, 100.0),
        QueueSaved(2, "orders-dlq", {}, 100.0),
        QueueSaved(3, "doomed", {}, 100.0),
        MessageInserted(1, 1, "m1", "g1", b"body-1", "text/plain", b"\x01extra", 0.0, b"digest-1"),
        MessageInserted(1, 2, "m2", "g1", b"", "application/json", b"", 0, None),
        MessageInserted(1, 3, "m3", "g2", b"\xff" * 300, "text/plain", b"", 150.5, None),
        MessageInserted(1, 4, "m4", "g3", b"four", "text/plain", b"", 0.0, None),
        MessageInserted(3, 9, "m9", "g9", b"nine", "text/plain", b"", 0.0, None),
        DedupSaved(1, "dedup-1", "m1", 1, "g1", 9_999.0),
        MessagesClaimed((ClaimRow(1, 7, 130.0, 1, 101.0), ClaimRow(3, 8, 140.0, 2, 99.0)), "worker-a"),
        ClaimsChanged(((1, 160.0), (3, 90.0))),
        TokensRaised((1, 2), 12),
        HistorySaved(((1, 1, "m1", {"attempts": [{"n": 1, "outcome": "failed"}]}), (3, 1, "m3", None))),
        AvailabilityChanged(((2, 200.0),)),
        ReceiveCountsRestored(((3, 120.0, 1, 99.0),)),
        AttemptLogged(
            1,
            "g1",
            "m1",
            "worker-a",
            1,
            "failed",
            "boom",
            "sig",
            [{"step": "a"}, 2**70],
            {"done": 1},
            None,
            12.5,
            30,
            101.0,
            2,
            9_999.0,
        ),
        AttemptLogged(1, "g1", "m1", "w-a", 2, "failed", "", "", None, None, None, None, 30, 102.0, 2, 9e3),
        AttemptLogged(1, "g1", "m1", "w-b", 3, "expired", "", "", [], [1], {}, 1.0, 30, 103.0, 2, 9e3),
        GroupPolicySaved(1, "g1", {"max_attempts": 3}),
        GroupPolicySaved(1, "g2", {"max_attempts": 5}),
        GroupPolicySaved(1, "g2", None),
        ParticipationChanged("worker-a", True, 101.0),
        ParticipationChanged("worker-b", True, 101.0),
        ParticipationChanged("worker-b", False, 102.0),
        FenceSaved("worker-a", {"reason": "drift", "since": 1.0}),
        FenceSaved("worker-c", {"reason": "x"}),
        FenceSaved("worker-c", None),
        SuspensionSaved("orders", {"reason": "errors", "manual": False, "since": 3.0}),
        SuspensionSaved("gone", None),
        BlacklistSaved("worker-a", {"reason": "r", "since": 1.0, "until": 2.0, "queue": "orders"}),
        BlacklistSaved("worker-z", None),
        HandoverSaved(1, "g1", {"donor": "w1", "phase": "arrived", "state": {"count": 3}}),
        HandoverSaved(1, "g2", {"donor": "w1", "phase": "awaiting", "state": None}),
        HandoverSaved(1, "g2", None),
        MessagesMoved((3,), 2, "orders"),  # dead-lettered
        MessagesMoved((4,), 2, None),
        MessagesMoved((3,), 1, None, redrive=True),
        MessagesDeleted((2,)),
        QueuePurged(2),
        QueueDropped(3),
    ]


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = sqlite3.connect(path)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: sorted(db.execute(f"SELECT * FROM {table}"), key=repr) for table in tables}
    finally:
        db.close()


def test_decoded_frames_give_the_same_store_rows(tmp_path: Path) -> None:
    original = store_effects()
    decoded: list[Effect] = []
    frames = split_effects(original, 300)  # several frames, as a long commit would be published
    assert len(frames) > 3
    for frame in frames:
        back = decode_frame(encode_frame(frame))
        assert isinstance(back, EffectsFrame)
        decoded.extend(back.effects)
    owner = SqliteStore(tmp_path / "owner.sqlite3", clock=lambda: 0.0)
    standby = SqliteStore(tmp_path / "standby.sqlite3", clock=lambda: 0.0)
    for store in (owner, standby):
        store.open(now=100.0)
    try:
        owner.apply(original)
        standby.apply(decoded)
    finally:
        owner.close()
        standby.close()
    owner_rows, standby_rows = dump(tmp_path / "owner.sqlite3"), dump(tmp_path / "standby.sqlite3")
    assert owner_rows == standby_rows
    # The history did reach every table (so the comparison compares something).
    for table in (
        "queues",
        "messages",
        "dedup",
        "message_history",
        "attempt_log",
        "group_policies",
        "participants",
        "fences",
        "suspensions",
        "blacklists",
    ):
        assert owner_rows[table], table


# ------------------------------------------------------------------------------------ refused input
def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


GOOD = encode_frame(EffectsFrame(tuple(store_effects())))

BAD_FRAMES = {
    "empty": b"",
    "reserved byte": b"\xc1",
    "not msgpack": b"hello, world",
    "extra data": GOOD + b"\x00",
    "not a list": pack({"version": FORMAT_VERSION}),
    "too short": pack([FORMAT_VERSION]),
    "newer version": pack([FORMAT_VERSION + 1, 0, []]),
    "version as bool": pack([True, 0, []]),
    "version as text": pack(["1", 0, []]),
    "unknown kind": pack([FORMAT_VERSION, 7, []]),
    "effects not a list": pack([FORMAT_VERSION, 0, {"a": 1}]),
    "effects frame too long": pack([FORMAT_VERSION, 0, [], 1]),
    "effect not a list": pack([FORMAT_VERSION, 0, [5]]),
    "effect empty": pack([FORMAT_VERSION, 0, [[]]]),
    "unknown effect type": pack([FORMAT_VERSION, 0, [[999, 1]]]),
    "effect type as text": pack([FORMAT_VERSION, 0, [["1", 1]]]),
    "too few fields": pack([FORMAT_VERSION, 0, [[2]]]),
    "too many fields": pack([FORMAT_VERSION, 0, [[2, 1, 2]]]),
    "redrive missing": pack([FORMAT_VERSION, 0, [[9, [1], 1, None]]]),
    "claim row too short": pack([FORMAT_VERSION, 0, [[5, [[1, 2, 3.0, 1]], "w"]]]),
    "claims not a list": pack([FORMAT_VERSION, 0, [[5, 3, "w"]]]),
    "keys not a list": pack([FORMAT_VERSION, 0, [[8, "123"]]]),
    "history row too long": pack([FORMAT_VERSION, 0, [[12, [[1, 1, "m", None, 5]]]]]),
    "unknown extension": pack([FORMAT_VERSION, 0, [[2, msgpack.ExtType(42, b"")]]]),
    "bad big integer": pack([FORMAT_VERSION, 0, [[2, msgpack.ExtType(1, b"12x")]]]),
    "unhashable map key": b"\x81\x90\x01",
    "epoch marker short": pack([FORMAT_VERSION, 1, 3, "n"]),
    "epoch as text": pack([FORMAT_VERSION, 1, "3", "n", "i"]),
    "node as bytes": pack([FORMAT_VERSION, 1, 3, b"n", "i"]),
}


@pytest.mark.parametrize("data", list(BAD_FRAMES.values()), ids=list(BAD_FRAMES))
def test_malformed_frames_are_refused(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode_frame(data)


def test_truncated_frames_are_refused() -> None:
    for frame in (GOOD, encode_frame(EpochMarker(5, "node-1", "inc"))):
        for end in range(len(frame)):
            with pytest.raises(CodecError):
                decode_frame(frame[:end])


def mutate(at: int, replacement: bytes) -> bytes:
    """GOOD with one byte replaced by up to three (or dropped)."""
    return GOOD[:at] + replacement + GOOD[at + 1 :]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200) | st.builds(mutate, st.integers(0, len(GOOD) - 1), st.binary(max_size=3)))
def test_any_input_decodes_or_raises_codec_error(data: bytes) -> None:
    try:
        frame = decode_frame(data)
    except CodecError:
        return
    assert isinstance(frame, EffectsFrame | EpochMarker)


# ------------------------------------------------------------------------------------ split_effects
@settings(max_examples=100, deadline=None)
@given(effects=st.lists(any_effect, max_size=30), max_bytes=st.integers(min_value=1, max_value=2_000))
def test_split_effects_keeps_order_and_bounds(effects: list[Effect], max_bytes: int) -> None:
    frames = split_effects(effects, max_bytes)
    assert [e for frame in frames for e in frame.effects] == effects  # all of them, in order, each once
    for frame in frames:
        data = encode_frame(frame)
        assert data == encode_frame(EffectsFrame(frame.effects))  # the carried encoding is the real one
        assert frame.effects
        assert len(data) <= max_bytes or len(frame.effects) == 1
        assert decode_frame(data) == frame
    for frame, following in itertools.pairwise(frames):  # greedy: no frame could take one more
        grown = EffectsFrame((*frame.effects, following.effects[0]))
        assert len(encode_frame(grown)) > max_bytes


def test_split_effects_of_a_large_commit() -> None:
    effects: list[Effect] = [
        MessageInserted(1, key, f"m{key}", "g", b"x" * 50, "text/plain", b"", 0.0, None)
        for key in range(70_000)
    ]
    effects.append(MessagesDeleted(tuple(range(70_000))))
    everything = split_effects(effects, 1 << 30)  # one frame: more than 65535 effects (a 32-bit array header)
    assert len(everything) == 1
    assert decode_frame(encode_frame(everything[0])) == EffectsFrame(tuple(effects))
    pieces = split_effects(effects, 64 * 1024)
    assert [e for frame in pieces for e in frame.effects] == effects
    assert all(len(encode_frame(f)) <= 64 * 1024 for f in pieces[:-1])
    assert len(encode_frame(pieces[-1])) > 64 * 1024  # the big delete travels alone
    assert pieces[-1].effects == (effects[-1],)


def test_split_effects_of_nothing_is_no_frames() -> None:
    assert split_effects([], 100) == []
