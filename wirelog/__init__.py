"""Wire log: schema-v1 records (docs/wirelog.md), a crash-safe rotating writer, redaction, a reader.

Modules: `record` (codec, compat, builders), `writer` (WireLogWriter), `reader` (segments, read_records,
merged_records, tail_records, RecordFilter, Follower), `redaction` (RedactionConfig, Redactor), `times`,
`errors`, `cli` (`strictq wirelog`). Names below are re-exported lazily so `import wirelog` (and the CLI)
stays cheap. See docs/wirelog.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SCHEMA_VERSION": "record",
    "KINDS": "record",
    "ACTIONS": "record",
    "encode": "record",
    "decode_line": "record",
    "compat": "record",
    "body_fields": "record",
    "http_record": "record",
    "http_request": "record",
    "http_response": "record",
    "delivery_record": "record",
    "log_record": "record",
    "event_record": "record",
    "WireLogWriter": "writer",
    "segments": "reader",
    "read_records": "reader",
    "merged_records": "reader",
    "ReadStats": "reader",
    "RecordFilter": "reader",
    "RedactionConfig": "redaction",
    "Redactor": "redaction",
    "Level": "redaction",
    "load_or_create_key": "redaction",
    "WireLogError": "errors",
    "RecordError": "errors",
    "TornLine": "errors",
    "UnknownVersion": "errors",
    "SegmentError": "errors",
    "ConfigError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wirelog' has no attribute {name!r}")
    return getattr(importlib.import_module(f"wirelog.{module}"), name)
