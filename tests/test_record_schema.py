"""The wire-log schema has one definition (wirelog.record's field tables): the builders follow it and
Spark's parse schema is derived from it, so a field added, renamed or retyped in one place shows here."""

from __future__ import annotations

from typing import Any

import pytest

from wirelog import record as wr

# Sample values per declared type; `None` is allowed for every field.
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "double": (int, float),
    "long": (int,),
    "bool": (bool,),
    "object": (dict,),
    "array": (list,),
    "any": (object,),
}


def _built() -> dict[str, wr.Record]:
    request = wr.http_request(method="GET", url="https://x.test/a", headers=[["a", "b"]], body=b"hi")
    omitted = {"bytes": 1, "sha256": "0"}
    response = wr.http_response(status=200, headers=None, headers_omitted=omitted, body=b"\xff")
    common: dict[str, Any] = {"ts": 1.5, "worker": "w", "queue": "q", "message_id": "m", "lease": 3}
    return {
        "http": wr.http_record(
            request=request, response=response, latency_ms=1.0, group="g", attempt=1, call=2, **common
        ),
        "delivery": wr.delivery_record(
            body=b"x", attributes={"k": "v"}, seq=4, receive_count=1, group="g", attempt=1, **common
        ),
        "log": wr.log_record(outcome="ok", reason="r", steps=["s"], partial={"p": 1}, group="g", **common),
        "event": wr.event_record(event="fenced", reason="r", group="g", **common),
    }


@pytest.mark.parametrize("kind", wr.KINDS)
def test_each_builder_writes_exactly_its_kinds_fields_with_their_types(kind: str) -> None:
    built = _built()[kind]
    declared = dict(wr.COMMON_FIELDS) | dict(wr.KIND_FIELDS[kind])
    writer_assigned = {"id", "writer"}
    assert set(built) == set(declared) - writer_assigned
    assert (built["v"], built["kind"]) == (wr.SCHEMA_VERSION, kind)
    for name, value in built.items():
        assert value is None or isinstance(value, _PY_TYPES[declared[name]]), (name, value)


def test_http_parts_follow_the_request_and_response_tables() -> None:
    built = _built()["http"]
    for part, table in (("request", wr.REQUEST_FIELDS), ("response", wr.RESPONSE_FIELDS)):
        declared = dict(table)
        assert set(built[part]) == set(declared)
        for name, value in built[part].items():
            assert value is None or isinstance(value, _PY_TYPES[declared[name]]), (part, name, value)


def test_every_kind_has_a_field_table_and_names_have_one_type() -> None:
    assert set(wr.KIND_FIELDS) == set(wr.KINDS)
    types = wr.field_types()  # raises when a name shared by two kinds has two types
    assert set(types) >= {name for name, _ in wr.COMMON_FIELDS}


def test_spark_reads_wirelogs_version_and_types() -> None:
    from spark import schema

    assert schema.RECORD_SCHEMA_VERSION == wr.SCHEMA_VERSION
    types = wr.field_types()
    nested = {"method": dict(wr.REQUEST_FIELDS)["method"], "url": dict(wr.REQUEST_FIELDS)["url"]}
    nested["status"] = dict(wr.RESPONSE_FIELDS)["status"]
    # The flat Parquet columns copied from a record field have that field's type.
    own = {"segment", "record"}
    for name, kind in schema.COLUMNS:
        if name not in own:
            assert kind == types.get(name, nested.get(name)), name


def test_sparks_parse_schema_is_the_wirelog_table() -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql import types as T

    from spark.schema import CORRUPT_COLUMN, spark_parse_schema

    spark_types = {T.StringType(): "string", T.DoubleType(): "double", T.LongType(): "long"}
    types = wr.field_types()
    parsed = spark_parse_schema()
    for field in parsed.fields:
        if field.name == CORRUPT_COLUMN:
            continue
        if field.name in ("request", "response"):
            table = dict(wr.REQUEST_FIELDS if field.name == "request" else wr.RESPONSE_FIELDS)
            assert types[field.name] == "object"
            for sub in field.dataType.fields:
                assert spark_types[sub.dataType] == table[sub.name], (field.name, sub.name)
        else:
            assert spark_types[field.dataType] == types[field.name], field.name
