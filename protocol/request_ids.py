"""Request ids: one per gateway request, the way X-Request-Id, AWS request ids and trace ids work.

The gateway takes a client's `X-Request-Id` when it is well formed (1-128 characters of letters, digits
and `- _ . : + = / @`, so a UUID, a hex or base64 id or an `Root=1-...` style trace id all pass) and
otherwise makes one: a random UUID-shaped id (`0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0`). The id of the
request that *sent* a message stays with the message and comes back with each delivery to workers that
ask for it, which tag their outbound calls with it (`X-Strictq-Request-Id`), so the wire log's records
of a message carry the producer's request id (docs/contracts.md, docs/wirelog.md).

A request id names a request; it authorises nothing and is not a secret. Standard library only.
"""

from __future__ import annotations

import os
import re

MAX_LENGTH = 128
# fullmatch: `$` would also take a trailing newline
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_.:+=/@-]{1,128}")
RULE = "1-128 characters of letters, digits and - _ . : + = / @"


def is_request_id(value: object) -> bool:
    """Whether `value` is a well-formed request id (a str of the rule above)."""
    return isinstance(value, str) and REQUEST_ID_RE.fullmatch(value) is not None


def new_request_id() -> str:
    """A fresh id: 128 random bits (one getrandom call, fork-safe) in the shape of a UUID, as AWS's are."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def accept_request_id(supplied: str | None) -> str:
    """The request's id: the client's when it is well formed, else a new one (never an error: a bad
    X-Request-Id is the client's business, and the request still gets an id to be found by)."""
    if supplied is not None and REQUEST_ID_RE.fullmatch(supplied) is not None:
        return supplied
    return new_request_id()
