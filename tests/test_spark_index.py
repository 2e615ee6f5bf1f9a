"""The index: bucket parity, lookups equal a brute-force scan, bounded reads, layout and refusal."""

from __future__ import annotations

import random
import string
import uuid
import zlib
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from spark_support import SAMPLE_BUCKETS, SampleIndex, brute_force

from spark import layout
from spark import search as search_module
from spark.buckets import bucket_of, spark_bucket
from spark.search import Query, QueryError, search
from spark.story import story_json


def _ids(rng: random.Random) -> list[str]:
    alphabet = string.ascii_letters + string.digits + "_.:-"
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(200)]
    ids += ["".join(rng.choices(alphabet, k=rng.randint(1, 128))) for _ in range(200)]
    ids += ["", "m-42", "é", "ü-é-😀", "消息-7", "\u0000x", "a" * 1000, "Ω≈ç√∫", "🙂" * 20]
    ids += ["".join(chr(rng.randint(0x80, 0x2FFFF)) for _ in range(rng.randint(1, 12))) for _ in range(100)]
    return [i for i in ids if not any(0xD800 <= ord(c) <= 0xDFFF for c in i)]


def test_bucket_parity_spark_sql_and_python(spark: Any) -> None:
    from pyspark.sql import functions as F

    ids = _ids(random.Random(3))
    frame = spark.createDataFrame([(i,) for i in ids], "id string")
    for buckets in (1, 7, 64, 4096):
        got = frame.select("id", spark_bucket(F.col("id"), buckets).alias("b")).collect()
        assert {r.id: r.b for r in got} == {i: bucket_of(i, buckets) for i in ids}
    nulls = spark.createDataFrame([(None,)], "id string").select(spark_bucket(F.col("id"), 64).alias("b"))
    assert nulls.collect()[0].b == bucket_of(None, 64) == 0
    assert bucket_of("abc", 64) == zlib.crc32(b"abc") % 64


def _present_and_absent(sample: SampleIndex, rng: random.Random) -> tuple[list[str], list[str]]:
    present = rng.sample(sample.traffic.message_ids, 25)
    absent = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(10)] + ["m-0", "zzzz", "0"]
    return present, absent


def test_lookup_equals_brute_force_scan(spark_sample: SampleIndex) -> None:
    present, absent = _present_and_absent(spark_sample, random.Random(5))
    for message_id in present + absent:
        expected = brute_force(spark_sample.wirelog, message_id)
        got = story_json(search(spark_sample.index, Query(message_id=message_id)))["records"]
        assert got == expected, message_id
        assert bool(expected) == (message_id in present)
    total = layout.load_state(spark_sample.index).records
    assert total == spark_sample.records > 0


def test_lookup_opens_only_its_bucket_and_few_row_groups(
    spark_sample: SampleIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Path] = []
    real_open = search_module.open_parquet

    def counting(path: Path) -> Any:
        opened.append(Path(path))
        return real_open(path)

    monkeypatch.setattr(search_module, "open_parquet", counting)
    state = layout.load_state(spark_sample.index)
    pruned_somewhere = False
    for message_id in [*random.Random(9).sample(spark_sample.traffic.message_ids, 15), "absent-id"]:
        opened.clear()
        result = search(spark_sample.index, Query(message_id=message_id))
        bucket = bucket_of(message_id, SAMPLE_BUCKETS)
        assert result.stats.bucket == bucket
        assert opened == layout.bucket_files(spark_sample.index, state, bucket)  # its files, nothing else
        # Read only row groups whose min/max admits the id: at most two per file (an id can straddle).
        read = 0
        for path in opened:
            metadata = pq.ParquetFile(path).metadata
            column = metadata.schema.to_arrow_schema().get_field_index("message_id")
            admitting = [
                i
                for i in range(metadata.num_row_groups)
                if (s := metadata.row_group(i).column(column).statistics).min <= message_id <= s.max
            ]
            assert len(admitting) <= 2
            read += len(admitting)
            pruned_somewhere |= metadata.num_row_groups > len(admitting)
        assert result.stats.row_groups_read == read
        assert result.stats.row_groups_read <= 2 * len(opened)
        assert result.stats.row_groups_total > result.stats.row_groups_read
    assert pruned_somewhere


def test_index_files_are_sorted_zstd_with_bloom_filters(spark_sample: SampleIndex) -> None:
    state = layout.load_state(spark_sample.index)
    assert state.buckets == SAMPLE_BUCKETS and sorted(state.files) == list(range(SAMPLE_BUCKETS))
    for path in layout.all_files(spark_sample.index, state):
        parquet = pq.ParquetFile(path)
        metadata = parquet.metadata
        assert metadata.num_row_groups >= 2  # small row groups (16 KiB in the tests)
        column = parquet.schema_arrow.get_field_index("message_id")
        for i in range(metadata.num_row_groups):
            chunk = metadata.row_group(i).column(column)
            assert chunk.compression == "ZSTD"
            assert chunk.bloom_filter_offset is not None and chunk.bloom_filter_length > 0
            assert chunk.statistics.has_min_max
        table = parquet.read(columns=["message_id", "ts"])
        keys = list(zip(table.column("message_id").to_pylist(), table.column("ts").to_pylist(), strict=True))
        assert keys == sorted(keys, key=lambda k: (k[0] is not None, k[0] or "", k[1]))
        bucket = int(path.parent.name.split("=")[1])
        assert {bucket_of(m, SAMPLE_BUCKETS) for m, _ in keys} == {bucket}


def test_spark_lookup_uses_the_bucket_and_equals_brute_force(spark: Any, spark_sample: SampleIndex) -> None:
    from spark.lookup import spark_lookup

    for message_id in [*random.Random(4).sample(spark_sample.traffic.message_ids, 3), "absent-id"]:
        rows = spark_lookup(spark, spark_sample.index, message_id)
        assert [orjson.loads(r["record"]) for r in rows] == brute_force(spark_sample.wirelog, message_id)


def test_every_kind_is_indexed(spark_sample: SampleIndex) -> None:
    message_id = next(
        m
        for m in spark_sample.traffic.message_ids
        if {"event"} <= {r["kind"] for r in brute_force(spark_sample.wirelog, m)}
    )
    kinds = {r["kind"] for r in search(spark_sample.index, Query(message_id=message_id)).rows}
    assert kinds == {"http", "delivery", "log", "event"}


def test_group_worker_status_and_time_filters(spark_sample: SampleIndex) -> None:
    from wirelog.reader import RecordFilter, read_records

    every = list(read_records(spark_sample.wirelog, include_open=False))
    some = every[len(every) // 3]
    since, until = some["ts"] - 5, some["ts"] + 5
    cases = [
        (Query(group=some["group"]), RecordFilter(group=some["group"])),
        (Query(worker="w2", status="5xx"), RecordFilter(worker="w2", status="5xx")),
        (
            Query(group=some["group"], since=since, until=until),
            RecordFilter(group=some["group"], since=since, until=until),
        ),
        (
            Query(message_id=some["message_id"], status=502),
            RecordFilter(message_id=some["message_id"], status=502),
        ),
    ]
    for query, where in cases:
        expected = sorted((r for r in every if where.matches(r)), key=lambda r: (r["ts"], r["id"]))
        assert story_json(search(spark_sample.index, query))["records"] == expected, query


def test_malformed_queries_are_query_errors(spark_sample: SampleIndex) -> None:
    for query in (
        Query(message_id="has space"),
        Query(message_id=""),
        Query(message_id="x" * 129),
        Query(message_id="a\nb"),
        Query(),
        Query(message_id="m", since=10.0, until=5.0),
        Query(message_id="m", status="7xx"),
        Query(group="with space"),
    ):
        with pytest.raises(QueryError):
            search(spark_sample.index, query)


def test_an_index_of_another_version_or_bucket_count_is_refused(
    spark_sample: SampleIndex, tmp_path: Path
) -> None:
    with pytest.raises(layout.IndexMismatch, match="built with 4 buckets, not 64"):
        layout.open_for_write(spark_sample.index, 64)
    other = tmp_path / "other"
    other.mkdir()
    doc = orjson.loads((spark_sample.index / layout.STATE_FILE).read_bytes())
    (other / layout.STATE_FILE).write_bytes(orjson.dumps({**doc, "version": 99}))
    with pytest.raises(layout.IndexMismatch, match="format version 99"):
        search(other, Query(message_id="m-1"))
    (other / layout.STATE_FILE).write_bytes(b'{"format": "something-else"}')
    with pytest.raises(layout.IndexMismatch, match="holds no strictq wire-log index"):
        layout.open_for_write(other, None)
    with pytest.raises(layout.IndexMissing):
        search(tmp_path / "none", Query(message_id="m-1"))
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "unrelated.txt").write_text("x")
    with pytest.raises(layout.IndexMismatch, match="not empty"):
        layout.open_for_write(tmp_path / "stuff", 8)
