"""The one place a SparkSession is built: local[2] by default, any master by flag, loopback, UI off.

Measured here: a local session takes ~6-8 s to start and the driver heap is fixed when the JVM starts,
so `spark.driver.memory` is a flag applied before the first session. SPARK_LOCAL_IP=127.0.0.1 keeps
the driver off non-loopback addresses; PYSPARK_PYTHON pins Python workers to this interpreter (the
jobs use SQL functions only, but a worker version mismatch would otherwise fail any Python fallback).
Under `spark-submit` the master and memory come from spark-submit, so they are not overridden.

Quiet by default: the JVM's log4j2 configuration logs errors only, and names PySpark's gateway logger so
Spark does not announce `Setting default log level to "WARN"` with its setLogLevel advice (Spark prints
that when the gateway's logger has no level of its own and the root level differs from WARN). The one
line log4j cannot reach, the JVM's own `WARNING: Using incubator modules` (Spark 4 starts it with
`--add-modules=jdk.incubator.vector`), is dropped from the JVM's stderr by a relay thread; everything
else the JVM prints passes through. `STRICTQ_SPARK_LOG_LEVEL=WARN` (or INFO) shows more.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_MASTER = "local[2]"
DEFAULT_DRIVER_MEMORY = "2g"
DEFAULT_SHUFFLE_PARTITIONS = 4


# JVM logging: errors only, one line each; a failed task's stack trace resurfaces as the job's exception.
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark: %p %c{1}: %m%n%ex{3}
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""
# Lines of the JVM's stderr that are noise to a user of `strictq index` (not log4j's: the JVM's own).
JVM_NOISE = (b"WARNING: Using incubator modules:",)


def log4j_config() -> Path:
    """The log4j2 file the driver JVM is started with (written once per content, in the temp dir)."""
    digest = hashlib.sha256(LOG4J2.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"strictq-spark-log4j2-{digest}.properties"
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(LOG4J2)
        os.replace(tmp, path)
    return path


JAVA_OPTIONS_ENV = "STRICTQ_SPARK_JAVA_OPTIONS"


def under_spark_submit() -> bool:
    """spark-submit starts Python with a gateway already running (and its master chosen)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    *,
    master: str | None = None,
    driver_memory: str | None = None,
    shuffle_partitions: int | None = None,
    app_name: str = "strictq",
    extra: dict[str, str] | None = None,
) -> Any:
    """A SparkSession configured for strictq's jobs (getOrCreate: reuses a running one)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark 4.3 warns at import that it "does not yet fully support pandas >= 3.0.0" whenever pandas 3 is
    # installed (the bench extra brings it); strictq's jobs use no pandas, so that is noise to a user.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if not under_spark_submit():
        builder = builder.master(master or DEFAULT_MASTER)
        builder = builder.config("spark.driver.memory", driver_memory or DEFAULT_DRIVER_MEMORY)
        # STRICTQ_SPARK_JAVA_OPTIONS: more driver JVM options (GC, JIT), e.g. the test suite's quick-start
        # `-XX:TieredStopAtLevel=1` for its many small jobs.
        java_options = f"-Dlog4j2.configurationFile=file:{log4j_config()}"
        if os.environ.get(JAVA_OPTIONS_ENV):
            java_options += " " + os.environ[JAVA_OPTIONS_ENV]
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    elif master:
        builder = builder.master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or DEFAULT_SHUFFLE_PARTITIONS),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.files.ignoreCorruptFiles": "false",  # a bad gzip is salvaged and reported, not dropped
        "spark.sql.files.ignoreMissingFiles": "false",  # a vanished segment is re-resolved, never a gap
        "spark.sql.adaptive.enabled": "true",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.hadoop.parquet.enable.summary-metadata": "false",
        # Hadoop's local file system applies its own umask, not the process's: the index holds (redacted)
        # wire-log records, so it gets the segments' modes (files 0640, directories 0750) and no looser.
        "spark.hadoop.fs.permissions.umask-mode": "027",
        **(extra or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _quiet_jvm_start():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("STRICTQ_SPARK_LOG_LEVEL", "ERROR"))
    return session


@contextlib.contextmanager
def _quiet_jvm_start() -> Iterator[None]:
    """While a new JVM starts, make fd 2 a pipe read by a relay thread that drops `JVM_NOISE` lines.

    The JVM inherits the pipe as its stderr for its whole life (so do its Python workers); this process
    gets its own stderr back as soon as the session exists. No-op when a JVM is already running (a second
    session, spark-submit) or fd 2 cannot be duplicated."""
    from pyspark import SparkContext

    if getattr(SparkContext, "_gateway", None) is not None or under_spark_submit():
        yield
        return
    try:
        original = os.dup(2)
    except OSError:
        yield
        return
    read_end, write_end = os.pipe()
    threading.Thread(
        target=_relay, args=(read_end, original), name="strictq-spark-stderr", daemon=True
    ).start()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the JVM (and its children) are now the pipe's only writers


def _relay(read_end: int, target: int) -> None:
    """Copy whole lines from `read_end` to `target`, without the JVM's noise, until every writer is gone."""
    pending = b""
    while True:
        try:
            chunk = os.read(read_end, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        out = b"".join(line + b"\n" for line in lines if not line.startswith(JVM_NOISE))
        if len(pending) > 65536:  # a very long line without an end yet: pass it on as it is
            out, pending = out + pending, b""
        _write(target, out)
    if pending and not pending.startswith(JVM_NOISE):
        _write(target, pending)
    os.close(read_end)
    os.close(target)


def _write(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # our stderr is gone (a closed pipe): nothing to tell anyone
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
