"""The index directory and its one commit point, `_index.json`.

```
<index>/_index.json                  committed state: format, version, bucket count, files per bucket
<index>/data/bucket=<b>/*.parquet    the index (b = pmod(crc32(message_id), buckets))
<index>/manifest/batch-<K>.json      which segments batch K indexed, what it skipped (written first)
<index>/manifest/upto-<K>.json       consolidated manifests of batches <= K
<index>/_staging/                    Spark output of the batch in progress (never read by lookups)
<index>/_stream/                     the --follow query's checkpoint
<index>/errors/                      `strictq errors` output (signatures, templates, alert state)
<index>/.lock                        flock held by the one writer (index, compact, follow)
```

A batch (or a compaction) is visible only once `_index.json` names its files, and that file is
replaced atomically (write, fsync, rename, fsync the directory). A run that dies anywhere before that
leaves files nobody references; the next writer removes them (`remove_orphans`) and redoes the batch,
so a killed run leaves neither duplicates nor gaps. Lookups read `_index.json` and open only the files
it lists.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .buckets import check_bucket_count
from .schema import INDEX_FORMAT, INDEX_VERSION, RECORD_SCHEMA_VERSION

STATE_FILE = "_index.json"
DATA_DIR = "data"
MANIFEST_DIR = "manifest"
STAGING_DIR = "_staging"
STREAM_DIR = "_stream"
ERRORS_DIR = "errors"
LOCK_FILE = ".lock"
CONSOLIDATE_AFTER = 64  # batch manifests before they are merged into one upto-K.json
_BATCH_MANIFEST = re.compile(r"^batch-(\d{8,})\.json$")
_UPTO_MANIFEST = re.compile(r"^upto-(\d{8,})\.json$")


class IndexLayoutError(Exception):
    """The index directory cannot be used as asked; the message says why and what to do."""


class IndexMissing(IndexLayoutError):
    """No index at that path (nothing was indexed there yet)."""


class IndexMismatch(IndexLayoutError):
    """The directory holds an index of another format version or bucket count."""


class IndexBusy(IndexLayoutError):
    """Another writer (index, compact, follow) holds the index's lock."""


@dataclass(slots=True)
class IndexState:
    """What `_index.json` says: the committed index."""

    buckets: int
    last_batch: int = 0
    generation: int = 0  # compactions committed
    records: int = 0
    files: dict[int, list[str]] = field(default_factory=dict)  # bucket -> file names in data/bucket=<b>/
    created: float = 0.0
    updated: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "record_schema": RECORD_SCHEMA_VERSION,
            "buckets": self.buckets,
            "bucket_function": "pmod(crc32(utf8(message_id or '')), buckets)",
            "sort": ["message_id", "ts"],
            "last_batch": self.last_batch,
            "generation": self.generation,
            "records": self.records,
            "created": self.created,
            "updated": self.updated,
            "files": {str(b): names for b, names in sorted(self.files.items()) if names},
        }

    def file_count(self) -> int:
        return sum(len(names) for names in self.files.values())

    def max_files_per_bucket(self) -> int:
        return max((len(names) for names in self.files.values()), default=0)


def bucket_dir(root: Path, bucket: int) -> Path:
    return root / DATA_DIR / f"bucket={bucket}"


def bucket_files(root: Path, state: IndexState, bucket: int) -> list[Path]:
    directory = bucket_dir(root, bucket)
    return [directory / name for name in state.files.get(bucket, ())]


def all_files(root: Path, state: IndexState) -> list[Path]:
    return [path for bucket in sorted(state.files) for path in bucket_files(root, state, bucket)]


# ------------------------------------------------------------------------------------------- state
def load_state(root: Path) -> IndexState:
    """The committed state; IndexMissing / IndexMismatch with a message meant for an operator."""
    path = Path(root) / STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IndexMissing(
            f"no index at {root} (no {STATE_FILE}); build one with "
            f"`strictq index --wirelog DIR --index {root}`"
        ) from None
    except NotADirectoryError:
        raise IndexMissing(f"{root} is not a directory") from None
    try:
        doc = orjson.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise IndexMismatch(f"{path} is not an index state file ({exc})") from None
    if doc.get("format") != INDEX_FORMAT:
        raise IndexMismatch(f"{root} holds no strictq wire-log index (format {doc.get('format')!r})")
    if doc.get("version") != INDEX_VERSION:
        raise IndexMismatch(
            f"the index at {root} has format version {doc.get('version')!r}; this strictq reads and writes "
            f"version {INDEX_VERSION}: rebuild it into a new directory (`strictq index --index NEW_DIR`)"
        )
    try:
        buckets = check_bucket_count(doc["buckets"])
        files = {int(b): [str(n) for n in names] for b, names in doc.get("files", {}).items()}
        return IndexState(
            buckets=buckets,
            last_batch=int(doc.get("last_batch", 0)),
            generation=int(doc.get("generation", 0)),
            records=int(doc.get("records", 0)),
            files=files,
            created=float(doc.get("created", 0.0)),
            updated=float(doc.get("updated", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexMismatch(f"{path} is damaged ({exc!r}); rebuild the index into a new directory") from None


def open_for_write(root: Path, buckets: int | None) -> IndexState:
    """The committed state, creating an empty index if there is none; refuses another bucket count."""
    try:
        state = load_state(root)
    except IndexMissing:
        if root.exists() and not root.is_dir():
            raise
        if root.is_dir() and any(p.name not in (LOCK_FILE, STAGING_DIR) for p in root.iterdir()):
            raise IndexMismatch(
                f"{root} is not empty and holds no index ({STATE_FILE} missing): "
                "give an empty or new directory"
            ) from None
        now = time.time()
        state = IndexState(buckets=check_bucket_count(buckets or 64), created=now, updated=now)
        commit_state(root, state)
        return state
    if buckets is not None and buckets != state.buckets:
        raise IndexMismatch(
            f"the index at {root} was built with {state.buckets} buckets, not {buckets}: the bucket count is "
            "fixed per index (leave out --buckets, or build a new index in another directory)"
        )
    return state


def commit_state(root: Path, state: IndexState) -> None:
    """Atomically replace `_index.json`: the commit point of batches and compactions."""
    state.updated = time.time()
    write_atomic(root / STATE_FILE, orjson.dumps(state.to_json(), option=orjson.OPT_INDENT_2))


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------- lock
@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """One writer per index at a time (flock: released by the kernel if the process dies)."""
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / LOCK_FILE, "a+b")  # closed below
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBusy(
                f"another `strictq index` (or --compact / --follow) is writing {root}; wait for it to finish"
            ) from None
        yield
    finally:
        handle.close()


# -------------------------------------------------------------------------------------- manifests
def manifest_path(root: Path, batch: int) -> Path:
    return root / MANIFEST_DIR / f"batch-{batch:08d}.json"


def write_manifest(root: Path, batch: int, doc: dict[str, Any]) -> None:
    write_atomic(manifest_path(root, batch), orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _manifests(root: Path) -> tuple[list[tuple[int, Path]], list[tuple[int, Path]]]:
    batches: list[tuple[int, Path]] = []
    uptos: list[tuple[int, Path]] = []
    directory = root / MANIFEST_DIR
    if not directory.is_dir():
        return batches, uptos
    for path in directory.iterdir():
        if match := _BATCH_MANIFEST.fullmatch(path.name):
            batches.append((int(match[1]), path))
        elif match := _UPTO_MANIFEST.fullmatch(path.name):
            uptos.append((int(match[1]), path))
    return sorted(batches), sorted(uptos)


def indexed_segments(root: Path, state: IndexState) -> set[str]:
    """Segment names (`writer.stamp.seq`) of every committed batch."""
    batches, uptos = _manifests(root)
    done: set[str] = set()
    floor = 0
    committed_uptos = [(k, p) for k, p in uptos if k <= state.last_batch]
    if committed_uptos:
        floor, path = committed_uptos[-1]
        done.update(orjson.loads(path.read_bytes())["segments"])
    for batch, path in batches:
        if floor < batch <= state.last_batch:
            done.update(s["name"] for s in orjson.loads(path.read_bytes())["segments"])
    return done


def committed_manifests(root: Path, state: IndexState) -> list[dict[str, Any]]:
    """The batch manifests not consolidated yet (newest last): what recent runs indexed and skipped."""
    batches, _ = _manifests(root)
    return [orjson.loads(p.read_bytes()) for k, p in batches if k <= state.last_batch]


def consolidate_manifests(root: Path, state: IndexState) -> None:
    """Merge committed batch manifests into one `upto-K.json` once there are many (keeps runs fast)."""
    batches, uptos = _manifests(root)
    committed = [(k, p) for k, p in batches if k <= state.last_batch]
    if len(committed) < CONSOLIDATE_AFTER:
        return
    segments = sorted(indexed_segments(root, state))
    last = state.last_batch
    write_atomic(
        root / MANIFEST_DIR / f"upto-{last:08d}.json", orjson.dumps({"upto": last, "segments": segments})
    )
    for _, path in committed:
        path.unlink(missing_ok=True)
    for k, path in uptos:
        if k < last:
            path.unlink(missing_ok=True)
    fsync_dir(root / MANIFEST_DIR)


# --------------------------------------------------------------------------------------- recovery
def remove_orphans(root: Path, state: IndexState) -> list[str]:
    """Delete what a dead run left: staging output, uncommitted manifests, data files nobody lists."""
    removed: list[str] = []
    staging = root / STAGING_DIR
    if staging.exists():
        if any(staging.iterdir()):
            removed.append(STAGING_DIR)
        shutil.rmtree(staging)
    batches, uptos = _manifests(root)
    for batch, path in [*batches, *uptos]:
        if batch > state.last_batch:
            path.unlink()
            removed.append(f"{MANIFEST_DIR}/{path.name}")
    data = root / DATA_DIR
    if data.is_dir():
        for directory in data.iterdir():
            match = re.fullmatch(r"bucket=(-?\d+)", directory.name)
            listed = set(state.files.get(int(match[1]), ())) if match else set()
            for path in directory.iterdir() if directory.is_dir() else ():
                if path.name not in listed:
                    path.unlink()
                    removed.append(f"{DATA_DIR}/{directory.name}/{path.name}")
            if match is None or not any(directory.iterdir()):
                directory.rmdir() if directory.is_dir() else directory.unlink()
    return removed
