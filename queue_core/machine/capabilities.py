"""What a worker declares it can do on a poll: the opt-in to failure management (issue 12).

The SDK declares `results, probes` on every poll: the EmoDB face's header `X-Strictq-Capabilities`
(comma-separated tokens, case-insensitive, whitespace around them allowed) or the internal API's receive
body `"capabilities": ["results", "probes"]`. `results`: the worker reports attempt results, so its
lapsed claims are failure evidence and it takes part in fencing, same-worker retries and probing;
`probes`: it can also be handed probe (dummy) items; `request_ids`: its poll items carry `request_id`, the
id of the request that sent each message (the EmoDB face's opt-in; the core itself ignores it); `state`:
it keeps local state per group and takes part in state transfer (machine.handover: its poll items carry a
moved group's state, its poll answers name the groups whose state it should export); `estimates`: its poll
items carry `estimate` (seconds to process and pre-process; machine.estimates). Unknown
tokens are ignored (forward compatibility);
a malformed declaration is refused with a 400 naming the header (or field). A client that declares
nothing (boto3, the AWS CLI, curl, any EmoDB client) gets plain queue semantics.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from protocol import headers

from .errors import InvalidArgument

HEADER = headers.CAPABILITIES
FIELD = "capabilities"  # the internal API's receive body
RESULTS = "results"
PROBES = "probes"
REQUEST_IDS = "request_ids"
STATE = "state"
ESTIMATES = "estimates"
CONTROL = (
    "control"  # it follows fleet control messages: poll answers may say some are pending (docs/fleet.md)
)
KNOWN = frozenset({RESULTS, PROBES, REQUEST_IDS, STATE, ESTIMATES, CONTROL})
MAX_TOKENS = 16
MAX_BYTES = 256
TOKEN_RE = re.compile(r"[a-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """One poll's declaration (only the known tokens are kept)."""

    results: bool = False
    probes: bool = False
    request_ids: bool = False  # poll items name the request that sent each message (a face's rendering)
    # The software version the worker runs (`X-Strictq-Worker-Version`, the internal API's `version`): not a
    # token but carried with the declaration, for group routing's canary share (routing.py). "": unnamed.
    version: str = ""
    # The largest message body the worker takes (`X-Strictq-Worker-Max-Bytes`, the internal API's
    # `max_bytes`): bigger heads go to a worker that can take them, when one polls. 0: any size.
    max_bytes: int = 0
    state: bool = False  # local state per group: transferred state inline, export requests (handover)
    estimates: bool = False  # poll items carry processing-time estimates (pipelining workers)
    control: bool = False  # poll answers carry X-Strictq-Control: pending when controls wait (a face's)

    @property
    def participates(self) -> bool:
        """The poll takes part in failure management (it declared `results`)."""
        return self.results

    @property
    def takes_probes(self) -> bool:
        """It may be handed probe items: `probes` counts only with `results` (a probe needs a result)."""
        return self.results and self.probes

    def tokens(self) -> list[str]:
        return [
            name for name in (RESULTS, PROBES, REQUEST_IDS, STATE, ESTIMATES, CONTROL) if getattr(self, name)
        ]


PLAIN = Capabilities()
SDK = Capabilities(results=True, probes=True, request_ids=True)


def _from_tokens(tokens: Iterable[str], field: str) -> Capabilities:
    seen: set[str] = set()
    count = 0
    for raw in tokens:
        count += 1
        if count > MAX_TOKENS:
            raise InvalidArgument(f"{field} declares more than {MAX_TOKENS} capabilities", field=field)
        token = raw.strip().lower()
        if not token:
            raise InvalidArgument(f"{field} has an empty capability (e.g. two commas in a row)", field=field)
        if not TOKEN_RE.fullmatch(token):
            raise InvalidArgument(
                f"{field}: a capability is made of a-z, 0-9, '_' and '-', got {raw.strip()[:40]!r}",
                field=field,
            )
        seen.add(token)
    return Capabilities(
        results=RESULTS in seen,
        probes=PROBES in seen,
        request_ids=REQUEST_IDS in seen,
        state=STATE in seen,
        estimates=ESTIMATES in seen,
        control=CONTROL in seen,
    )


MAX_VERSION = 64
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]*")


def with_version(capabilities: Capabilities, value: object, field: str) -> Capabilities:
    """The declaration with the poller's version (None or "": unnamed); a malformed one is refused."""
    if value is None or value == "":
        return capabilities
    if not isinstance(value, str) or len(value) > MAX_VERSION or not VERSION_RE.fullmatch(value):
        raise InvalidArgument(
            f"{field} must be 1 to {MAX_VERSION} characters of letters, digits, '.', '_', '+' and '-'",
            field=field,
        )
    return dataclasses.replace(capabilities, version=value)


MAX_DECLARED_BYTES = 1 << 40


def with_max_bytes(capabilities: Capabilities, value: object, field: str) -> Capabilities:
    """The declaration with the poller's largest message (None: any); a malformed one is refused."""
    if value is None:
        return capabilities
    if isinstance(value, str):
        if not value.isdigit() or not value.isascii():
            raise InvalidArgument(f"{field} must be a whole number of bytes", field=field)
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_DECLARED_BYTES:
        raise InvalidArgument(f"{field} must be a whole number of bytes, 0 (any) or more", field=field)
    return dataclasses.replace(capabilities, max_bytes=value)


def parse_header(values: Iterable[str]) -> Capabilities:
    """The header's values (repeated headers are one comma-separated list, as HTTP says); none: plain.
    A header that is present but blank declares nothing."""
    values = list(values)
    if not values:
        return PLAIN
    text = ",".join(values)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise InvalidArgument(f"{HEADER} is over {MAX_BYTES} bytes", field=HEADER)
    if not text.strip():
        return PLAIN
    return _from_tokens(text.split(","), HEADER)


def parse_list(value: Any, field: str = FIELD) -> Capabilities:
    """The internal API's `capabilities`: a list of strings (absent or null: plain)."""
    if value is None:
        return PLAIN
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidArgument(f"{field} must be a list of strings", field=field)
    if sum(len(item.encode("utf-8", "surrogatepass")) + 1 for item in value) > MAX_BYTES:
        raise InvalidArgument(f"{field} is over {MAX_BYTES} bytes", field=field)
    return _from_tokens(value, field)
