"""`strictq index --follow`: keep indexing segments as they close, with Structured Streaming.

A file-stream source over the wire-log directory (`binaryFile`, paths only: the content is never read
by the stream) notices closed segments (`*.jsonl`, `*.jsonl.gz`); each micro-batch (processing-time
trigger, `foreachBatch`) runs the ordinary incremental build. The build is idempotent by manifest, so
when Spark replays a micro-batch after a crash (same batch id, its checkpoint not yet committed) the
segments are already indexed and nothing is written twice. The run holds the index's writer lock for
its whole life and compacts buckets that reach `max_files` files.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import layout
from .compact import DEFAULT_MAX_FILES, run_compact
from .index import IndexReport, run_index

log = logging.getLogger("strictq.spark.follow")
SEGMENT_GLOB = "*.{jsonl,jsonl.gz}"
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"


def run_follow(
    spark: Any,
    wirelog_dir: Path,
    index_dir: Path,
    *,
    interval: str = "10 seconds",
    buckets: int | None = None,
    max_files: int = DEFAULT_MAX_FILES,
    stop: threading.Event | None = None,
    on_batch: Callable[[int, IndexReport], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Run until `stop` is set (or SIGTERM/SIGINT in the main thread); returns micro-batches handled."""
    wirelog_dir, index_dir = Path(wirelog_dir), Path(index_dir)
    stop = stop or threading.Event()
    handled = 0
    failure: list[BaseException] = []
    restore = _install_signals(stop)
    try:
        with layout.writer_lock(index_dir):
            layout.open_for_write(index_dir, buckets)

            def each(batch_df: Any, batch_id: int) -> None:
                nonlocal handled
                try:
                    report = run_index(
                        spark,
                        wirelog_dir,
                        index_dir,
                        buckets=buckets,
                        stream_batch=batch_id,
                        progress=progress,
                        locked=True,
                    )
                    state = report.state
                    if state is not None and state.max_files_per_bucket() > max_files:
                        run_compact(spark, index_dir, min_files=max_files, locked=True, progress=progress)
                    handled += 1
                    if on_batch is not None:
                        on_batch(batch_id, report)
                except BaseException as exc:  # surfaces in the main loop; Spark would only log it
                    failure.append(exc)
                    stop.set()
                    raise

            stream = (
                spark.readStream.format("binaryFile")
                .schema(BINARY_FILE_SCHEMA)
                .option("pathGlobFilter", SEGMENT_GLOB)
                .load(str(wirelog_dir))
                .select("path")
            )
            query = (
                stream.writeStream.foreachBatch(each)
                .trigger(processingTime=interval)
                .option("checkpointLocation", str(index_dir / layout.STREAM_DIR / "checkpoint"))
                .queryName("strictq-index-follow")
                .start()
            )
            try:
                while query.isActive and not stop.is_set():
                    query.awaitTermination(1)
            finally:
                if query.isActive:
                    query.stop()
    finally:
        restore()
    if failure:
        raise failure[0]
    return handled


def _install_signals(stop: threading.Event) -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: stop.set())

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
