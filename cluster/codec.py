"""The replicated frame codec: what a partition's owner appends to its JetStream stream, and standbys read.

A frame is either the durable effects of one group commit (`EffectsFrame`, applied by a standby with
`SqliteStore.apply`) or an owner's epoch marker (`EpochMarker`). The stream is network input, so the
encoding is msgpack over a fixed type table (no pickle, no reflection over arbitrary classes):

    effects frame: [FORMAT_VERSION, 0, [[type number, field, field, ...], ...]]
    epoch marker:  [FORMAT_VERSION, 1, epoch, node, incarnation]

Each effect is a flat row of its dataclass fields in declaration order, keyed by a type number that is
never reused (add new types at the end of `_TABLE`). A type may gain fields at its end, with defaults: its
spec then says how many (`optional`), and rows written before them (shorter by up to that many) decode
with the defaults, so a stream appended by an older owner stays readable (MessageInserted's `request_id`).
A frame with the new fields is refused by an older node (a wrong field count): upgrade standbys first.
Tuples go out as msgpack arrays and come back as tuples (nested `ClaimRow`s as `ClaimRow`s); JSON values
(dicts, lists) come back as dicts and lists; bytes, None, bools and floats are kept as they are. An
integer beyond 64 bits (a worker's log data may hold one) travels as an extension so that it comes back
exact.

Decoding checks the shape (version, frame kind, type number, field count, nested rows), not the type of
each scalar: the publisher is the partition's owner, and a standby must store exactly what it stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgpack  # type: ignore[import-untyped]  # no stubs, no py.typed

from queue_core.machine.effects import (
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

FORMAT_VERSION = 1

_EFFECTS_KIND = 0
_EPOCH_KIND = 1
_BIG_INT = 1  # msgpack extension code: an integer beyond 64 bits, as its decimal text


class CodecError(Exception):
    """A frame that cannot be encoded or decoded (garbage, an unknown version or type, a wrong shape)."""


@dataclass(frozen=True, slots=True)
class EffectsFrame:
    """The durable effects of one group commit (or of one piece of it: `split_effects`)."""

    effects: tuple[Effect, ...]
    # The encoding, when split_effects already built it (so that encode_frame does not redo the work).
    _encoded: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class EpochMarker:
    """An owner took the partition: the epoch it serves it under (fencing tokens start at epoch << 32)."""

    epoch: int
    node: str
    incarnation: str


Frame = EffectsFrame | EpochMarker


# ------------------------------------------------------------------------------------ nested fields
def _rows_of(width: int, make: Callable[..., Any] | None) -> Callable[[Any], tuple[Any, ...]]:
    """A decoder for a tuple of fixed-width rows: each row back to a tuple (or to `make(*row)`)."""

    def decode(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise CodecError(f"expected a list of rows, got {type(value).__name__}")
        for row in value:
            if type(row) is not list or len(row) != width:
                raise CodecError(f"expected rows of {width} values, got {_describe(row)}")
        if make is None:
            return tuple([tuple(row) for row in value])
        return tuple([make(*row) for row in value])

    return decode


def _values(value: Any) -> tuple[Any, ...]:
    if type(value) is not list:
        raise CodecError(f"expected a list, got {type(value).__name__}")
    return tuple(value)


def _claims(claims: tuple[ClaimRow, ...]) -> list[tuple[int, int, float, int, float]]:
    return [(c.key, c.token, c.expires, c.receive_count, c.first_receive_at) for c in claims]


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return type(value).__name__


# ------------------------------------------------------------------------------------- type table
@dataclass(frozen=True, slots=True)
class _Spec:
    number: int
    cls: type[Any]
    width: int  # number of fields
    optional: int  # trailing fields (with defaults) a row written by an older version may lack
    get: Callable[[Any], tuple[Any, ...]]  # the field values, in declaration order
    encoders: tuple[tuple[int, Callable[[Any], Any]], ...]  # (field index, to msgpack) where needed
    decoders: tuple[tuple[int, Callable[[Any], Any]], ...]  # (field index, from msgpack) where needed


def _spec(
    number: int,
    cls: type[Any],
    encoders: dict[str, Callable[[Any], Any]] | None = None,
    decoders: dict[str, Callable[[Any], Any]] | None = None,
    optional: int = 0,
) -> _Spec:
    names: tuple[str, ...] = cls.__match_args__  # the dataclass fields, in declaration order
    getter = attrgetter(*names)
    get: Callable[[Any], tuple[Any, ...]] = getter if len(names) > 1 else (lambda e: (getter(e),))
    return _Spec(
        number,
        cls,
        len(names),
        optional,
        get,
        tuple((names.index(name), f) for name, f in (encoders or {}).items()),
        tuple((names.index(name), f) for name, f in (decoders or {}).items()),
    )


_pairs = _rows_of(2, None)

# Type numbers are part of the format: never renumber or reuse one; a new effect type takes a new number.
_TABLE: tuple[_Spec, ...] = (
    _spec(1, QueueSaved),
    _spec(2, QueueDropped),
    _spec(3, MessageInserted, optional=1),  # request_id: frames from before request ids lack it
    _spec(4, DedupSaved),
    _spec(5, MessagesClaimed, encoders={"claims": _claims}, decoders={"claims": _rows_of(5, ClaimRow)}),
    _spec(6, ClaimsChanged, decoders={"changes": _pairs}),
    _spec(7, TokensRaised, decoders={"keys": _values}),
    _spec(8, MessagesDeleted, decoders={"keys": _values}),
    _spec(9, MessagesMoved, decoders={"keys": _values}),
    _spec(10, QueuePurged),
    _spec(11, AttemptLogged),
    _spec(12, HistorySaved, decoders={"rows": _rows_of(4, None)}),
    _spec(13, AvailabilityChanged, decoders={"rows": _pairs}),
    _spec(14, ReceiveCountsRestored, decoders={"rows": _rows_of(4, None)}),
    _spec(15, GroupPolicySaved),
    _spec(16, ParticipationChanged),
    _spec(17, FenceSaved),
    _spec(18, SuspensionSaved),
    _spec(19, BlacklistSaved),
    _spec(20, HandoverSaved),
    _spec(21, FleetControlSaved),
    _spec(22, FleetPolicySaved),
)

_BY_CLASS: dict[type[Any], _Spec] = {spec.cls: spec for spec in _TABLE}
_BY_NUMBER: dict[int, _Spec] = {spec.number: spec for spec in _TABLE}


# ---------------------------------------------------------------------------------------- encoding
def _default(value: Any) -> Any:
    """msgpack's hook for what it cannot pack itself: only integers beyond 64 bits are accepted."""
    if isinstance(value, int):
        return msgpack.ExtType(_BIG_INT, str(value).encode("ascii"))
    raise TypeError(f"cannot encode a value of type {type(value).__name__}")


def _ext(code: int, data: bytes) -> Any:
    if code == _BIG_INT:
        try:
            return int(data.decode("ascii"))
        except ValueError:
            raise CodecError("malformed big integer in frame") from None
    raise CodecError(f"unknown msgpack extension {code} in frame")


def _row(effect: Effect) -> tuple[Any, ...] | list[Any]:
    spec = _BY_CLASS.get(type(effect))
    if spec is None:
        raise CodecError(f"{type(effect).__name__} is not a durable effect: it is never replicated")
    values = spec.get(effect)
    if not spec.encoders:
        return (spec.number, *values)
    row = [spec.number, *values]
    for index, encode in spec.encoders:
        row[index + 1] = encode(row[index + 1])
    return row


def _rows(effects: Sequence[Effect]) -> list[tuple[Any, ...] | list[Any]]:
    try:
        return [_row(effect) for effect in effects]
    except AttributeError as exc:  # a nested value of the wrong kind (a claim that is not a ClaimRow)
        raise CodecError(f"cannot encode effect: {exc}") from None


def _pack(obj: Any) -> bytes:
    try:
        data: bytes = msgpack.packb(obj, use_bin_type=True, default=_default)
    except (TypeError, ValueError, OverflowError) as exc:  # ValueError: a str that is not valid Unicode
        raise CodecError(f"cannot encode frame: {exc}") from None
    return data


def encode_frame(frame: Frame) -> bytes:
    """The bytes to publish for one frame."""
    if isinstance(frame, EffectsFrame):
        if frame._encoded is not None:
            return frame._encoded
        return _pack((FORMAT_VERSION, _EFFECTS_KIND, _rows(frame.effects)))
    if isinstance(frame, EpochMarker):
        return _pack((FORMAT_VERSION, _EPOCH_KIND, frame.epoch, frame.node, frame.incarnation))
    raise CodecError(f"not a frame: {type(frame).__name__}")


def _array_header(count: int) -> bytes:
    """msgpack's header of an array of `count` items (what packb writes before them)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


_FRAME_HEAD = _array_header(3) + msgpack.packb(FORMAT_VERSION) + msgpack.packb(_EFFECTS_KIND)


def split_effects(effects: Sequence[Effect], max_bytes: int) -> list[EffectsFrame]:
    """Consecutive pieces of `effects`, in order, each encoding to at most `max_bytes` (an effect larger
    than that on its own travels alone). Each effect is encoded once; the frames carry their encoding, so
    that `encode_frame` on them only returns it. No effects: no frames."""
    packer = msgpack.Packer(use_bin_type=True, default=_default)
    frames: list[EffectsFrame] = []
    start = 0
    parts: list[bytes] = []
    size = 0  # of parts
    for index, row in enumerate(_rows(effects)):
        try:
            part: bytes = packer.pack(row)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"cannot encode frame: {exc}") from None
        if parts and len(_FRAME_HEAD) + len(_array_header(len(parts) + 1)) + size + len(part) > max_bytes:
            frames.append(_frame(effects[start:index], parts))
            start, parts, size = index, [], 0
        parts.append(part)
        size += len(part)
    if parts:
        frames.append(_frame(effects[start:], parts))
    return frames


def _frame(effects: Sequence[Effect], parts: list[bytes]) -> EffectsFrame:
    encoded = b"".join((_FRAME_HEAD, _array_header(len(parts)), *parts))
    return EffectsFrame(tuple(effects), encoded)


# ---------------------------------------------------------------------------------------- decoding
def decode_frame(data: bytes) -> Frame:
    """The frame in `data`; CodecError, naming what is wrong, for anything this version did not write."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext)
    except CodecError:
        raise
    except Exception as exc:  # msgpack's own errors (ValueError subclasses), unhashable keys, ...
        raise CodecError(f"not a frame ({type(exc).__name__}: {exc})") from None
    if type(obj) is not list or len(obj) < 2:
        raise CodecError(f"not a frame: expected [version, kind, ...], got {_describe(obj)}")
    version, kind = obj[0], obj[1]
    if version != FORMAT_VERSION or type(version) is not int:
        raise CodecError(f"unknown frame format version {version!r} (this node reads {FORMAT_VERSION})")
    if kind == _EFFECTS_KIND and type(kind) is int:
        if len(obj) != 3 or type(obj[2]) is not list:
            raise CodecError("malformed effects frame: expected [version, 0, [effects]]")
        try:
            return EffectsFrame(tuple([_effect(row) for row in obj[2]]))
        except CodecError:
            raise
        except (TypeError, ValueError) as exc:  # a nested row the dataclass refuses
            raise CodecError(f"malformed effect in frame: {exc}") from None
    if kind == _EPOCH_KIND and type(kind) is int:
        if len(obj) != 5:
            raise CodecError(f"malformed epoch marker: expected 5 values, got {len(obj)}")
        _, _, epoch, node, incarnation = obj
        if type(epoch) is not int or type(node) is not str or type(incarnation) is not str:
            raise CodecError("malformed epoch marker: expected [version, 1, epoch, node, incarnation]")
        return EpochMarker(epoch, node, incarnation)
    raise CodecError(f"unknown frame kind {kind!r}")


def _effect(row: Any) -> Effect:
    if type(row) is not list or not row:
        raise CodecError(f"malformed effect: expected [type, fields...], got {_describe(row)}")
    number = row[0]
    spec = _BY_NUMBER.get(number) if type(number) is int else None
    if spec is None:
        raise CodecError(f"unknown effect type {number!r} in frame")
    if not spec.width - spec.optional <= len(row) - 1 <= spec.width:
        raise CodecError(f"malformed {spec.cls.__name__}: expected {spec.width} fields, got {len(row) - 1}")
    for index, decode in spec.decoders:
        if index + 1 < len(row):
            row[index + 1] = decode(row[index + 1])
    effect: Effect = spec.cls(*row[1:])
    return effect
