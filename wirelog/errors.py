"""The wire log's error family: one base class so callers can catch everything the log raises."""

from __future__ import annotations


class WireLogError(Exception):
    """Base of every error the wire-log package raises on purpose."""


class RecordError(WireLogError, ValueError):
    """A record (or a line) is not a valid wire-log record: not JSON, not an object, bad field."""


class TornLine(RecordError):
    """The last line of a segment ends without a newline: the writer stopped mid-record."""

    def __init__(self, size: int) -> None:
        super().__init__(f"torn last line ({size} bytes without a newline)")
        self.size = size


class UnknownVersion(RecordError):
    """The record's schema version is newer (or other) than this code understands."""

    def __init__(self, version: object) -> None:
        super().__init__(f"unknown wire-log schema version {version!r}")
        self.version = version


class SegmentError(WireLogError):
    """A segment file or the log directory cannot be used (in use by another writer, I/O failure)."""


class ConfigError(WireLogError, ValueError):
    """The redaction configuration or its key file is invalid."""
