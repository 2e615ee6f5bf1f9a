"""Segment file names and the directory primitives the writer and the reader share.

A segment is `<writer>.<stamp>.<seq>.jsonl` plus a state suffix:

- `.jsonl.open`    being written (at most one per live writer; a crashed writer may leave one);
- `.jsonl`         closed and complete (fsynced), waiting for compression, or final with compress off;
- `.jsonl.gz.tmp`  compression in progress: never read, removed by the next writer of that name;
- `.jsonl.gz`      final (gzip: Spark and zcat read it natively).

`stamp` is the writer instance's start time (UTC, microseconds, e.g. `20261122T100000123456Z`) and
`seq` counts segments within the instance, so sorting by (stamp, seq) orders one writer's segments in
time, and the stamp alone keeps a restarted writer's files and record ids apart from its predecessor's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

OPEN = ".jsonl.open"
CLOSED = ".jsonl"
GZ = ".jsonl.gz"
TMP = ".jsonl.gz.tmp"
STATES = (OPEN, CLOSED, GZ, TMP)

WRITER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SEGMENT = re.compile(
    r"^(?P<writer>[A-Za-z0-9_-]{1,64})\.(?P<stamp>\d{8}T\d{12}Z)\.(?P<seq>\d{6,})"
    r"(?P<state>\.jsonl\.open|\.jsonl\.gz\.tmp|\.jsonl\.gz|\.jsonl)$"
)


@dataclass(frozen=True, slots=True)
class SegmentName:
    """A parsed segment file name; `key` orders segments in time (start stamp, then sequence)."""

    writer: str
    stamp: str
    seq: int
    state: str  # one of STATES

    @property
    def base(self) -> str:
        return f"{self.writer}.{self.stamp}.{self.seq:06d}"

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.stamp, self.seq, self.writer)

    def filename(self, state: str) -> str:
        return self.base + state


def parse_segment_name(name: str) -> SegmentName | None:
    """The parts of a segment file name, or None for any other file (lock files, foreign files)."""
    match = _SEGMENT.fullmatch(name)
    if match is None:
        return None
    return SegmentName(match["writer"], match["stamp"], int(match["seq"]), match["state"])


def stamp_from_micros(micros: int) -> str:
    """`20261122T100000123456Z` for a time in microseconds since the epoch (sorts as text)."""
    seconds, fraction = divmod(max(micros, 0), 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y%m%dT%H%M%S") + f"{fraction:06d}Z"


def micros_from_stamp(stamp: str) -> int:
    moment = datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000 + int(stamp[15:21])


def fsync_dir(directory: Path) -> None:
    """Make renames, creations and removals in `directory` durable (POSIX needs the directory fsynced)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
