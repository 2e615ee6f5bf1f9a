"""Replay masks: JSON paths and regexes, applied alike to recordings and candidates."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from fencing.mimic import identity_from_url
from fencing.replay.masking import MASK, MaskConfig, Masker, MaskError, parse_path
from fencing.replay.matching import masked_identity


def masked(paths: list[str], document: object, regexes: tuple[str, ...] = ()) -> object:
    return orjson.loads(Masker(MaskConfig(tuple(paths), regexes)).body(orjson.dumps(document)))


def test_json_paths() -> None:
    doc = {"a": {"ts": 1, "keep": 2}, "items": [{"id": "x", "n": 1}, {"id": "y", "n": 2}], "ts": 3}
    assert masked(["$.a.ts"], doc) == {**doc, "a": {"ts": MASK, "keep": 2}}
    assert masked(["$.items[*].id"], doc)["items"] == [{"id": MASK, "n": 1}, {"id": MASK, "n": 2}]
    assert masked(["$.items[1].n"], doc)["items"][1] == {"id": "y", "n": MASK}
    assert masked(["$.items[-1].n"], doc)["items"][1]["n"] == MASK
    assert masked(["$..ts"], doc) == {**doc, "a": {"ts": MASK, "keep": 2}, "ts": MASK}
    assert masked(["$.*.ts"], doc)["a"]["ts"] == MASK and masked(["$.*.ts"], doc)["ts"] == 3
    assert masked(["$['a']['keep']"], doc)["a"] == {"ts": 1, "keep": MASK}
    assert masked(["$"], doc) == MASK
    assert masked(["$.absent", "$.items[9].id"], doc) == doc


def test_unchanged_bodies_keep_their_bytes_and_recorded_hash() -> None:
    masker = Masker(MaskConfig(("$.ts",), (r"\d{4}-\d{2}-\d{2}",)))
    body = b'{"b": 1, "a": 2}'
    assert masker.body(body) is body
    assert masker.body_sha256(body, "recorded") == "recorded"
    assert masker.body(b"not json") == b"not json"
    assert Masker().body_sha256(None, "recorded") == "recorded"


def test_equal_masked_documents_hash_alike_whatever_the_key_order() -> None:
    masker = Masker(MaskConfig(("$.sent_at",)))
    one = masker.body_sha256(b'{"order": 1, "sent_at": 1.5}', "x")
    two = masker.body_sha256(b'{"sent_at": 99.25, "order": 1}', "y")
    assert one == two == hashlib.sha256(b'{"order":1,"sent_at":"<masked>"}').hexdigest()
    assert masker.body_sha256(b'{"order": 2, "sent_at": 1.5}', "z") != one


def test_regexes_mask_bodies_paths_and_queries() -> None:
    masker = Masker(MaskConfig((), (r"req-[0-9a-f]{8}",)))
    assert masker.body(b"id=req-0123abcd&x=1") == b"id=<masked>&x=1"
    identity = identity_from_url("GET", "https://api.example/v1/req-deadbeef?trace=req-0badf00d", "sha")
    assert masked_identity(identity, None, masker) == (
        "GET",
        "api.example",
        "/v1/<masked>",
        "trace=<masked>",
        "sha",
    )
    assert masked_identity(identity, None, None) is identity


def test_bad_masks_are_named(tmp_path: Path) -> None:
    for path in ("sent_at", "$.a[", "$.a b"):
        with pytest.raises(MaskError, match="JSON path"):
            parse_path(path)
    with pytest.raises(MaskError, match="mask regex"):
        Masker(MaskConfig((), ("(",)))
    bad = tmp_path / "masks.toml"
    bad.write_text('json_paths = ["$.ok"]\nregex = ["x"]\n')
    with pytest.raises(MaskError, match=r"unknown key.*regex"):
        MaskConfig.load(bad)


def test_config_files(tmp_path: Path) -> None:
    toml = tmp_path / "masks.toml"
    toml.write_text('[mask]\njson_paths = ["$.sent_at"]\nregexes = ["\\\\d+"]\n')
    loaded = MaskConfig.load(toml)
    assert loaded == MaskConfig(("$.sent_at",), (r"\d+",))
    json_file = tmp_path / "masks.json"
    json_file.write_bytes(orjson.dumps({"json_paths": ["$.id", "$.sent_at"]}))
    merged = loaded.merged(MaskConfig.load(json_file))
    assert merged.json_paths == ("$.sent_at", "$.id") and merged.regexes == (r"\d+",)
    assert MaskConfig.from_dict(merged.to_dict()) == merged
