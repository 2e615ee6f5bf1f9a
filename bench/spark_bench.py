"""The wire-log search benchmark: index build, lookups (whole process and warm), brute force, size.

Records come from `spark.sample.Traffic` (uuid message ids, varied hosts, paths and JSON bodies,
retries, known failures) written by the real wire-log writer as gzip segments, by two generator
processes. 1M records by default, 10M with BENCH_SCALE=large, 100k with --quick. Figures:

- build: `strictq index` as a process (JVM start included) and the Spark job alone, records/s;
- lookup p50/p95 of present and absent ids via `strictq search` (a whole process each time) and via the
  same pyarrow lookup in a warm process, and via a warm Spark session (the bucket's files, with the
  Parquet bloom filter and statistics pushed down);
- brute force: `strictq wirelog grep --message-id` over the raw segments (the ratio to the lookup);
- size of the index against the raw records (uncompressed) and the gzip segments;
- peers, if installed (the `bench` extra): chdb (MergeTree ordered by message id) and tantivy (term query).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCALES = {"quick": 100_000, "default": 1_000_000, "large": 10_000_000}
LOOKUPS = 20  # whole-process lookups per kind (present / absent)
ROUTE_TARGET_MS = 20.0  # GET /admin/v1/search warm p50 (issue 19)
SPARK_LOOKUPS = 10
BUILD_TARGET = 60_000.0  # records/s in a fresh JVM at 1M records (issue 19; was 50,000)
LOOKUP_TARGET_MS = 150.0  # `strictq search` p50, whole process (issue 19; was 300 ms at 10M)
RATIO_TARGET = 100.0
SIZE_TARGET = 0.30
Progress = Any


def scale(quick: bool) -> tuple[str, int]:
    name = "quick" if quick else os.environ.get("BENCH_SCALE", "default")
    if name not in SCALES:
        raise ValueError(f"BENCH_SCALE must be one of {', '.join(SCALES)}, not {name!r}")
    return name, SCALES[name]


def _strictq() -> list[str]:
    script = Path(sys.executable).parent / "strictq"
    return [str(script)] if script.exists() else [sys.executable, "-m", "strictq"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": _pct(ms, 0.5), "p95_ms": _pct(ms, 0.95), "n": len(ms)}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ generate
_GENERATE = """
import sys, orjson
from pathlib import Path
from spark.sample import SampleSpec, Traffic
records, seed, suffix, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
traffic = Traffic(SampleSpec(messages=records, seed=seed, groups=5000, workers=64))
count = traffic.write_to(out, limit=records, suffix=suffix)
sample = traffic.message_ids[:: max(1, len(traffic.message_ids) // 2000)][:2000]
print(orjson.dumps({"records": count, "bytes": traffic.bytes_written, "ids": sample}).decode())
"""


def generate(directory: Path, records: int, progress: Progress) -> dict[str, Any]:
    """Two generator processes (both cores), each with its own writer names and seed."""
    import orjson

    started = time.perf_counter()
    half = records // 2
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _GENERATE, str(n), str(seed), suffix, str(directory)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        for n, seed, suffix in ((half, 101, "-a"), (records - half, 202, "-b"))
    ]
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=7200)
        if proc.returncode != 0:
            raise RuntimeError(f"record generator failed ({proc.returncode})")
        outputs.append(orjson.loads(out))
    total = sum(o["records"] for o in outputs)
    raw = sum(o["bytes"] for o in outputs)
    gz = sum(p.stat().st_size for p in directory.iterdir() if p.name.endswith(".gz"))
    seconds = time.perf_counter() - started
    progress(
        f"spark: generated {total:,} records ({raw / total:.0f} B each, {raw / 2**20:,.0f} MiB raw, "
        f"{gz / 2**20:,.0f} MiB gzip) in {seconds:.0f} s"
    )
    return {
        "records": total,
        "raw_bytes": raw,
        "gzip_bytes": gz,
        "segments": sum(1 for p in directory.iterdir() if p.name.endswith(".gz")),
        "seconds": seconds,
        "ids": [i for o in outputs for i in o["ids"]],
    }


# ---------------------------------------------------------------------------------------------- build
class TreeCpu:
    """CPU seconds of a process and all its descendants (the JVM is a grandchild nobody waits for, so
    rusage misses it): /proc is polled while they run and each pid's last reading kept."""

    def __init__(self, root: int) -> None:
        import threading

        self.root = root
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    text = (entry / "stat").read_text()
                    parents[int(entry.name)] = int(text[text.rindex(")") + 2 :].split()[1])
                except (OSError, ValueError):
                    continue
        tree, frontier = {self.root}, [self.root]
        while frontier:
            current = frontier.pop()
            for pid, parent in parents.items():
                if parent == current and pid not in tree:
                    tree.add(pid)
                    frontier.append(pid)
        return sorted(tree)

    def _poll(self) -> None:
        from .procstat import cpu_seconds

        while not self._stop.wait(0.5):
            for pid in self._tree():
                try:
                    self.seen[pid] = cpu_seconds(pid)
                except (OSError, ValueError):
                    pass

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=5)
        return sum(self.seen.values())


def build(wirelog: Path, index: Path, log: Path, progress: Progress) -> dict[str, Any]:
    import re

    from .procstat import machine_cpu

    busy0, total0 = machine_cpu()
    started = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [*_strictq(), "index", "--wirelog", str(wirelog), "--index", str(index), "--driver-memory", "4g"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        tree = TreeCpu(proc.pid)
        try:
            proc.wait(timeout=7200)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            own_cpu = tree.stop()  # the JVM included
    wall = time.perf_counter() - started
    busy1, total1 = machine_cpu()
    machine_cores = (busy1 - busy0) / max(total1 - total0, 1) * (os.cpu_count() or 1)
    if proc.returncode != 0:
        raise RuntimeError(f"strictq index failed ({proc.returncode}); see {log}")
    job_seconds = 0.0
    records = 0
    for match in re.finditer(r"batch \d+: ([\d,]+) record\(s\) in ([\d.]+) s", log.read_text()):
        records += int(match[1].replace(",", ""))
        job_seconds += float(match[2])
    result = {
        "wall_seconds": wall,
        "job_seconds": job_seconds,
        "records": records,
        "rate_wall": records / wall,
        "rate_job": records / job_seconds if job_seconds else 0.0,
        "index_bytes": _du(index / "data"),
        "cpu_seconds": own_cpu,
        "records_per_cpu_second": records / own_cpu if own_cpu else 0.0,
        "other_cores": max(0.0, machine_cores - own_cpu / wall),
    }
    progress(
        f"spark: strictq index: {records:,} records in {wall:.1f} s whole process"
        f" ({result['rate_wall']:,.0f}/s),"
        f" Spark job {job_seconds:.1f} s ({result['rate_job']:,.0f}/s); {own_cpu:.0f} CPU-s"
        f" ({result['records_per_cpu_second']:,.0f} records per CPU-second), other load"
        f" {result['other_cores']:.2f} cores"
    )
    return result


# ------------------------------------------------------------------------------------------- lookups
def cli_lookups(index: Path, ids: list[str]) -> list[float]:
    times = []
    for message_id in ids:
        started = time.perf_counter()
        subprocess.run(
            [*_strictq(), "search", "--index", str(index), "--message-id", message_id],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        times.append((time.perf_counter() - started) * 1000)
    return times


def warm_lookups(index: Path, ids: list[str]) -> tuple[list[float], dict[str, Any]]:
    from spark.search import Query, search

    search(index, Query(message_id=ids[0]))  # imports, page cache
    times, files, groups = [], 0, 0
    for message_id in ids:
        started = time.perf_counter()
        result = search(index, Query(message_id=message_id), with_records=False)
        times.append((time.perf_counter() - started) * 1000)
        files += len(result.stats.files_opened)
        groups += result.stats.row_groups_read
    return times, {"files_per_lookup": files / len(ids), "row_groups_per_lookup": groups / len(ids)}


_ROUTE_SERVER = """
import sys
from pathlib import Path
from aiohttp import web
from access.keys import Credential, KeyRing
from queue_core.admin_http import search_gate
from spark.admin_endpoint import SearchGate, add_search_route
app = web.Application()
keys = KeyRing([Credential("ops-bench", sys.argv[2], "operator", "ops")])
add_search_route(app, Path(sys.argv[1]), SearchGate(*search_gate(app, keys)))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[3]), access_log=None, print=None)
"""


def route_lookups(index: Path, present: list[str], absent: list[str], progress: Progress) -> dict[str, Any]:
    """`GET /admin/v1/search` warm: the gateway's route (spark.admin_endpoint: the lookup in a thread, the
    index's state and footers cached) in its own process over loopback HTTP, one keep-alive client;
    an operator key; p50/p95 per kind and the server's CPU per lookup (/proc)."""
    import asyncio
    import secrets
    import socket

    import aiohttp

    from .procstat import cpu_seconds

    secret = secrets.token_hex(16)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", _ROUTE_SERVER, str(index), secret, str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}/admin/v1/search"

    async def measure() -> tuple[dict[str, list[float]], float, int]:
        headers = {"X-BV-API-Key": secret}
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # the server starting
                try:
                    async with http.get(url, params={"message_id": present[0]}, headers=headers) as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            times: dict[str, list[float]] = {"present": [], "absent": []}
            cpu0 = cpu_seconds(server.pid)
            for message_id, kind in [(m, "present") for m in present] + [(m, "absent") for m in absent]:
                started = time.perf_counter()
                async with http.get(url, params={"message_id": message_id}, headers=headers) as r:
                    body = await r.read()
                    if r.status != 200 or (kind == "present") != (b'"records":[]' not in body):
                        raise RuntimeError(f"search route: {r.status} for a {kind} id: {body[:200]!r}")
                times[kind].append((time.perf_counter() - started) * 1000)
            return times, cpu_seconds(server.pid) - cpu0, len(present) + len(absent)

    try:
        times, cpu, n = asyncio.run(measure())
    finally:
        server.terminate()
        server.wait(timeout=30)
    result: dict[str, Any] = {k: _summary(v) for k, v in times.items()}
    result["cpu_us_per_lookup"] = cpu / n * 1e6
    progress(
        f"spark: GET /admin/v1/search warm p50/p95 present {_fmt(result['present'])}, absent"
        f" {_fmt(result['absent'])}; server CPU {result['cpu_us_per_lookup']:,.0f} us per lookup"
    )
    return result


def spark_lookups(
    index: Path, present: list[str], absent: list[str], progress: Progress, wirelog: Path, scratch: Path
) -> dict[str, Any]:
    """Warm-session figures: Spark lookups, and the index build again once the JVM is warm (the
    `strictq index` figure pays for JIT warm-up in its one batch)."""
    from spark.index import run_index
    from spark.lookup import spark_lookup
    from spark.session import build_session

    session = build_session(app_name="strictq-bench", driver_memory="4g")
    try:
        rebuilds = []
        for i in range(2):
            started = time.perf_counter()
            report = run_index(session, wirelog, scratch / f"rebuild-{i}", buckets=64)
            rebuilds.append((report.records, time.perf_counter() - started))
            shutil.rmtree(scratch / f"rebuild-{i}", ignore_errors=True)
        warm_rate = rebuilds[-1][0] / rebuilds[-1][1]
        progress(
            f"spark: index build in a warm session: {warm_rate:,.0f} records/s"
            f" (the first run in that session: {rebuilds[0][0] / rebuilds[0][1]:,.0f}/s)"
        )

        def one(message_id: str) -> float:
            started = time.perf_counter()
            spark_lookup(session, index, message_id, columns=("ts", "kind", "status"))
            return (time.perf_counter() - started) * 1000

        for message_id in present[:3]:  # warm-up: first jobs compile and load classes
            one(message_id)
        result = {
            "present": _summary([one(m) for m in present[:SPARK_LOOKUPS]]),
            "absent": _summary([one(m) for m in absent[:SPARK_LOOKUPS]]),
            "warm_build_rate": warm_rate,
        }
    finally:
        session.stop()
    progress(
        f"spark: warm Spark lookup p50 present {result['present']['p50_ms']:.0f} ms,"
        f" absent {result['absent']['p50_ms']:.0f} ms"
    )
    return result


def brute_force(wirelog: Path, message_id: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            [
                *_strictq(),
                "wirelog",
                "grep",
                "--dir",
                str(wirelog),
                "--message-id",
                message_id,
                "--closed-only",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=7200,
        )
        times.append((time.perf_counter() - started) * 1000)
    return times


# --------------------------------------------------------------------------------------------- peers
_CHDB_QUERY = """
import sys, chdb.session as chs
s = chs.Session(sys.argv[1])
sql = "SELECT ts, kind, record FROM bench.wire WHERE message_id = '%s' ORDER BY ts"
rows = s.query(sql % sys.argv[2], "CSV")
print(len(str(rows).splitlines()))
"""
_TANTIVY_QUERY = """
import sys, tantivy
index = tantivy.Index.open(sys.argv[1])
searcher = index.searcher()
query = tantivy.Query.term_query(index.schema, "message_id", sys.argv[2])
print(len([searcher.doc(address) for _, address in searcher.search(query, 1000).hits]))
"""


def _peer_process(code: str, path: Path, message_id: str) -> float:
    """A whole-process lookup; it must find the message (the peers are checked, not just timed)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), message_id], capture_output=True, text=True, timeout=120
    )
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0 or not done.stdout.split() or int(done.stdout.split()[-1]) == 0:
        raise RuntimeError(f"lookup process failed or found nothing: {done.stderr[-300:]}")
    return elapsed


def _peer_result(
    build_seconds: float, rows: int, path: Path, warm: Any, present: list[str], absent: list[str]
) -> dict[str, Any]:
    found: dict[str, int] = {}
    timed: dict[str, list[float]] = {"present": [], "absent": []}
    warm(present[0])
    for kind, ids in (("present", present), ("absent", absent)):
        total = 0
        for message_id in ids:
            started = time.perf_counter()
            total += warm(message_id)
            timed[kind].append((time.perf_counter() - started) * 1000)
        found[kind] = total
    if found["present"] == 0 or found["absent"] != 0:
        raise RuntimeError(f"peer lookups are wrong: {found}")
    return {
        "build_seconds": build_seconds,
        "rate": rows / build_seconds,
        "records": rows,
        "bytes": _du(path),
        "warm": {k: _summary(v) for k, v in timed.items()},
        "hits": found,
    }


def peer_chdb(
    wirelog: Path, work: Path, present: list[str], absent: list[str], progress: Progress
) -> dict[str, Any]:
    try:
        import chdb.session as chs
    except ImportError:
        return {"skipped": "chdb is not installed (pip install -e '.[bench]')"}
    path = work / "chdb"
    shutil.rmtree(path, ignore_errors=True)
    session = chs.Session(str(path))
    started = time.perf_counter()
    session.query("CREATE DATABASE IF NOT EXISTS bench")
    session.query(
        "CREATE TABLE bench.wire (message_id String, ts Float64, kind LowCardinality(String), record String)"
        " ENGINE = MergeTree ORDER BY (message_id, ts)"
    )
    session.query(
        "INSERT INTO bench.wire SELECT JSONExtractString(json, 'message_id'), JSONExtractFloat(json, 'ts'),"
        f" JSONExtractString(json, 'kind'), json FROM file('{wirelog}/*.jsonl.gz', 'JSONAsString')"
    )
    session.query("OPTIMIZE TABLE bench.wire FINAL")
    build_seconds = time.perf_counter() - started
    rows = int(str(session.query("SELECT count() FROM bench.wire", "CSV")).strip())

    def warm(message_id: str) -> int:
        result = session.query(
            f"SELECT ts, kind, record FROM bench.wire WHERE message_id = '{message_id}' ORDER BY ts", "CSV"
        )
        return len(str(result).splitlines())

    try:
        result = _peer_result(build_seconds, rows, path, warm, present, absent)
    finally:
        session.close()  # the directory is locked while a session holds it
    result["process"] = {"present": _summary([_peer_process(_CHDB_QUERY, path, m) for m in present[:5]])}
    progress(
        f"spark: chdb MergeTree: built in {build_seconds:.1f} s ({result['rate']:,.0f}/s), warm p50"
        f" {result['warm']['present']['p50_ms']:.1f} ms,"
        f" whole process {result['process']['present']['p50_ms']:.0f} ms"
    )
    return result


def peer_tantivy(
    wirelog: Path, work: Path, present: list[str], absent: list[str], progress: Progress
) -> dict[str, Any]:
    try:
        import tantivy
    except ImportError:
        return {"skipped": "tantivy is not installed (pip install -e '.[bench]')"}
    import orjson

    from wirelog.reader import read_records

    path = work / "tantivy"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("message_id", stored=False, tokenizer_name="raw")
    builder.add_float_field("ts", stored=True)
    builder.add_text_field("record", stored=True, index_option="basic", tokenizer_name="raw")
    schema = builder.build()
    index = tantivy.Index(schema, path=str(path))
    started = time.perf_counter()
    writer = index.writer(heap_size=512 * 2**20, num_threads=2)
    rows = 0
    for record in read_records(wirelog, include_open=False):
        writer.add_document(
            tantivy.Document(
                message_id=record.get("message_id") or "",
                ts=float(record.get("ts") or 0.0),
                record=orjson.dumps(record).decode(),
            )
        )
        rows += 1
    writer.commit()
    writer.wait_merging_threads()
    build_seconds = time.perf_counter() - started
    index.reload()
    searcher = index.searcher()

    def warm(message_id: str) -> int:
        hits = searcher.search(tantivy.Query.term_query(schema, "message_id", message_id), 1000).hits
        return len([searcher.doc(address) for _, address in hits])

    result = _peer_result(build_seconds, rows, path, warm, present, absent)
    result["process"] = {"present": _summary([_peer_process(_TANTIVY_QUERY, path, m) for m in present[:5]])}
    progress(
        f"spark: tantivy: built in {build_seconds:.1f} s ({result['rate']:,.0f}/s), warm p50"
        f" {result['warm']['present']['p50_ms']:.2f} ms,"
        f" whole process {result['process']['present']['p50_ms']:.0f} ms"
    )
    return result


# ------------------------------------------------------------------------------------------------ run
def run_spark_bench(work_dir: Path, quick: bool, out_dir: Path, progress: Progress) -> dict[str, Any]:
    name, records = scale(quick)
    work = work_dir / "spark"
    shutil.rmtree(work, ignore_errors=True)
    wirelog, index = work / "wirelog", work / "index"
    wirelog.mkdir(parents=True)
    progress(f"spark: {records:,} records ({name}; BENCH_SCALE=large for 10M)")
    generated = generate(wirelog, records, progress)
    rng = random.Random(17)
    present = rng.sample(generated.pop("ids"), LOOKUPS)
    absent = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(LOOKUPS)]
    result: dict[str, Any] = {"scale": name, "generated": generated}
    result["build"] = build(wirelog, index, out_dir / "spark-index.log", progress)

    cli = {"present": cli_lookups(index, present), "absent": cli_lookups(index, absent)}
    warm_present, reads = warm_lookups(index, present)
    warm_absent, _ = warm_lookups(index, absent)
    result["search"] = {
        "process": {k: _summary(v) for k, v in cli.items()},
        "warm": {"present": _summary(warm_present), "absent": _summary(warm_absent)},
        **reads,
    }
    progress(
        f"spark: strictq search p50/p95 present {_fmt(result['search']['process']['present'])},"
        f" absent {_fmt(result['search']['process']['absent'])}; warm pyarrow p50"
        f" {result['search']['warm']['present']['p50_ms']:.1f} ms"
    )
    result["search"]["route"] = route_lookups(index, present * 5, absent * 5, progress)  # 200 lookups
    runs = 1 if name == "large" else 2
    brute = {
        "present": brute_force(wirelog, present[0], runs),
        "absent": brute_force(wirelog, absent[0], runs),
    }
    brute_ms = statistics.median(brute["present"] + brute["absent"])
    result["brute_force"] = {"median_ms": brute_ms, "runs": brute}
    result["ratio"] = brute_ms / result["search"]["process"]["present"]["p50_ms"]
    progress(
        f"spark: brute-force grep {brute_ms / 1000:.1f} s: {result['ratio']:.0f}x the whole-process lookup"
    )
    result["spark_lookup"] = spark_lookups(index, present, absent, progress, wirelog, work)
    result["size"] = {
        "index_bytes": result["build"]["index_bytes"],
        "vs_raw": result["build"]["index_bytes"] / generated["raw_bytes"],
        "vs_gzip": result["build"]["index_bytes"] / generated["gzip_bytes"],
    }
    result["peers"] = {}
    for peer_name, peer in (("chdb", peer_chdb), ("tantivy", peer_tantivy)):
        try:
            result["peers"][peer_name] = peer(wirelog, work, present, absent, progress)
        except Exception as exc:  # a peer's failure must not lose our own figures
            result["peers"][peer_name] = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
            progress(f"spark: {peer_name} failed: {exc}")
    shutil.rmtree(work, ignore_errors=True)
    return result


def _fmt(s: dict[str, float]) -> str:
    return f"{s['p50_ms']:.0f}/{s['p95_ms']:.0f} ms"


# --------------------------------------------------------------------------------------------- report
def spark_section(results: dict[str, Any], add: Any) -> None:
    r = results.get("spark")
    if not r:
        return
    g, b, s = r["generated"], r["build"], r["search"]
    add("## Wire-log search (`strictq index` / `strictq search`)\n")
    add(
        f"{g['records']:,} generated wire-log records ({g['raw_bytes'] / g['records']:.0f} B each on average:"
        " uuid message ids, varied hosts, paths and JSON bodies, retries and known failures) in"
        f" {g['segments']} gzip segments written by the real wire-log writer."
        f" Scale `{r['scale']}` (BENCH_SCALE=large: 10M)."
        " The index: 64 crc32 buckets of Parquet sorted by message id then time, zstd, 1 MiB row groups, a"
        " bloom filter on message id. `strictq search` is a whole process each time (Python start, pyarrow"
        " import, `_index.json`, the bucket's footers, the admitted row groups); *warm* is the same lookup in"
        " a running process. *Brute force* is `strictq wirelog grep --message-id` over the raw segments.\n"
    )
    lookup_ok = s["process"]["present"]["p50_ms"] <= LOOKUP_TARGET_MS
    mib = 2**20
    present_warm, absent_warm = s["warm"]["present"]["p50_ms"], s["warm"]["absent"]["p50_ms"]
    spark_present, spark_absent = (
        r["spark_lookup"]["present"]["p50_ms"],
        r["spark_lookup"]["absent"]["p50_ms"],
    )
    size = r["size"]
    rows = [
        ("index build (the Spark job of `strictq index`: one batch in a fresh JVM)",
         f"{b['rate_job']:,.0f} records/s", f">= {BUILD_TARGET:,.0f}/s", b["rate_job"] >= BUILD_TARGET),
        ("index build (whole `strictq index`, JVM start included)", f"{b['rate_wall']:,.0f} records/s", "",
         None),
        ("index build, the same job again in a warm session (JIT warmed up)",
         f"{r['spark_lookup'].get('warm_build_rate', 0):,.0f} records/s", f">= {BUILD_TARGET:,.0f}/s",
         r["spark_lookup"].get("warm_build_rate", 0) >= BUILD_TARGET),
        ("index build CPU (JVM + Python) / other load on the machine meanwhile",
         f"{b.get('records_per_cpu_second', 0):,.0f} records per CPU-second /"
         f" {b.get('other_cores', 0):.2f} cores",
         "", None),
        ("`strictq search` present id, p50 / p95", _fmt(s["process"]["present"]),
         f"<= {LOOKUP_TARGET_MS:.0f} ms p50, whole process", lookup_ok),
        ("`strictq search` absent id, p50 / p95", _fmt(s["process"]["absent"]), "", None),
        ("warm pyarrow lookup present / absent, p50", f"{present_warm:.1f} / {absent_warm:.1f} ms", "", None),
        ("warm Spark lookup present / absent, p50", f"{spark_present:.0f} / {spark_absent:.0f} ms", "", None),
        *(
            [("`GET /admin/v1/search` warm (the gateway's route, own process, loopback HTTP) present /"
              " absent, p50 / p95; server CPU per lookup",
              f"{_fmt(s['route']['present'])} / {_fmt(s['route']['absent'])};"
              f" {s['route']['cpu_us_per_lookup']:,.0f} µs",
              f"<= {ROUTE_TARGET_MS:.0f} ms p50",
              max(s["route"]["present"]["p50_ms"], s["route"]["absent"]["p50_ms"]) <= ROUTE_TARGET_MS)]
            if "route" in s else []
        ),
        ("files / row groups read per lookup",
         f"{s['files_per_lookup']:.1f} / {s['row_groups_per_lookup']:.1f}", "", None),
        ("brute-force scan of the raw segments", f"{r['brute_force']['median_ms'] / 1000:.1f} s", "", None),
        ("brute force / `strictq search` p50", f"{r['ratio']:,.0f}x", f">= {RATIO_TARGET:.0f}x (at 10M)",
         r["ratio"] >= RATIO_TARGET),
        ("index size / raw records",
         f"{size['vs_raw']:.1%} ({size['index_bytes'] / mib:,.0f} MiB of {g['raw_bytes'] / mib:,.0f} MiB)",
         f"<= {SIZE_TARGET:.0%}", size["vs_raw"] <= SIZE_TARGET),
        ("index size / gzip segments", f"{size['vs_gzip']:.0%} ({g['gzip_bytes'] / mib:,.0f} MiB gzip)", "",
         None),
    ]  # fmt: skip
    add("| figure | measured | target | |")
    add("|---|---:|---|---|")
    for label, value, target, ok in rows:
        add(f"| {label} | {value} | {target} | {'' if ok is None else ('met' if ok else 'missed')} |")
    peers = r.get("peers") or {}
    if peers:
        add("\nPeers built from the same segments (the `bench` extra):\n")
        add("| peer | build | records/s | size | warm lookup p50 present / absent | whole process p50 |")
        add("|---|---:|---:|---:|---:|---:|")
        add(
            f"| strictq index + search | {b['job_seconds']:.1f} s | {b['rate_job']:,.0f} |"
            f" {r['size']['index_bytes'] / 2**20:,.0f} MiB | {s['warm']['present']['p50_ms']:.1f} /"
            f" {s['warm']['absent']['p50_ms']:.1f} ms | {s['process']['present']['p50_ms']:.0f} ms |"
        )
        for name, label in (
            ("chdb", "chdb (MergeTree ORDER BY message_id)"),
            ("tantivy", "tantivy (term query)"),
        ):
            p = peers.get(name)
            if not p:
                continue
            if "skipped" in p:
                add(f"| {label} | skipped: {p['skipped']} | | | | |")
                continue
            add(
                f"| {label} | {p['build_seconds']:.1f} s | {p['rate']:,.0f} | {p['bytes'] / 2**20:,.0f} MiB |"
                f" {p['warm']['present']['p50_ms']:.2f} / {p['warm']['absent']['p50_ms']:.2f} ms |"
                f" {p['process']['present']['p50_ms']:.0f} ms |"
            )
    add("")
