"""The one place a SparkSession is built: local[2] by default, any master by flag, loopback, UI off.

Measured here: a local session takes ~6-8 s to start and the driver heap is fixed when the JVM starts,
so `spark.driver.memory` is a flag applied before the first session. SPARK_LOCAL_IP=127.0.0.1 keeps
the driver off non-loopback addresses; PYSPARK_PYTHON pins Python workers to this interpreter (the
jobs use SQL functions only, but a worker version mismatch would otherwise fail any Python fallback).
Under `spark-submit` the master and memory come from spark-submit, so they are not overridden.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
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
"""


def log4j_config() -> Path:
    """The log4j2 file the driver JVM is started with (written once per content, in the temp dir)."""
    digest = hashlib.sha256(LOG4J2.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"strictq-spark-log4j2-{digest}.properties"
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(LOG4J2)
        os.replace(tmp, path)
    return path


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
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if not under_spark_submit():
        builder = builder.master(master or DEFAULT_MASTER)
        builder = builder.config("spark.driver.memory", driver_memory or DEFAULT_DRIVER_MEMORY)
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j_config()}"
        )
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
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("STRICTQ_SPARK_LOG_LEVEL", "ERROR"))
    return session
