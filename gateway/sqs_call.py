"""One authenticated SQS call: credential, region, parameters, queue URLs and ARNs; the face's state."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from access.keys import Credential
from access.permissions import visible_name
from queue_core.backend import QueueBackend
from queue_core.machine import QueueAttributes, QueueNotFound
from queue_core.machine.text import CONTROL_RE
from queue_core.scope import internal_name

from .app_keys import ROUTER
from .sqs_errors import NO_QUEUE, SqsError
from .sqs_queues import is_fifo

ATTEMPT_WINDOW = 300.0  # ReceiveRequestAttemptId is honoured for 5 minutes, as in SQS
MAX_ATTEMPTS = 10_000
PURGE_INTERVAL = 60.0


@dataclass(slots=True)
class Attempt:
    """A FIFO receive remembered under its ReceiveRequestAttemptId, so that a retry gets the same messages."""

    expires: float  # time.monotonic()
    items: list[tuple[str, int]]  # (message id, fencing token)
    messages: list[dict[str, Any]]  # as rendered for the first answer
    ttl: float


@dataclass(slots=True)
class MoveRecord:
    move_id: str
    tenant: str
    source: str  # internal names
    destination: str
    total: int
    rate: int | None


@dataclass
class SqsState:
    attempts: OrderedDict[tuple[str, str, str], Attempt] = field(default_factory=OrderedDict)
    purged_at: dict[str, float] = field(default_factory=dict)
    moves: dict[str, MoveRecord] = field(default_factory=dict)
    # The regions this endpoint answers for (`strictq serve --region`); None: any region. Queues are the same
    # whatever region a caller signs for; the region only names ARNs (sqs_regions).
    regions: frozenset[str] | None = None

    def attempt(self, key: tuple[str, str, str]) -> Attempt | None:
        now = time.monotonic()
        while self.attempts:
            oldest = next(iter(self.attempts.values()))
            if oldest.expires > now and len(self.attempts) <= MAX_ATTEMPTS:
                break
            self.attempts.popitem(last=False)
        return self.attempts.get(key)

    def remember(self, key: tuple[str, str, str], attempt: Attempt) -> None:
        self.attempts.pop(key, None)
        self.attempts[key] = attempt


SQS_STATE = web.AppKey("sqs_state", SqsState)


@dataclass(slots=True)
class Queue:
    name: str  # as the credential sees it
    internal: str  # `<tenant>.<name>` in the core
    attributes: QueueAttributes
    service: QueueBackend

    @property
    def fifo(self) -> bool:
        return is_fifo(self.attributes)


@dataclass
class Call:
    request: web.Request
    credential: Credential
    region: str
    params: dict[str, Any]

    @property
    def state(self) -> SqsState:
        return self.request.app[SQS_STATE]

    def service(self, internal: str = "") -> QueueBackend:
        return self.request.app[ROUTER].for_queue(internal)

    def service_for_group(self, group: str | None, internal: str) -> QueueBackend:
        router = self.request.app[ROUTER]
        return router.for_queue(internal) if group is None else router.for_group(group)

    # --------------------------------------------------------------------------------- names
    @property
    def tenant(self) -> str:
        return self.credential.tenant

    def url(self, name: str) -> str:
        return f"{self.request.scheme}://{self.request.host}/{self.tenant}/{name}"

    def arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.tenant}:{name}"

    def arn_of(self, internal: str) -> str | None:
        name = visible_name(self.credential, internal)
        return None if name is None else self.arn(name)

    def is_own_account(self, account: str) -> bool:
        return account in (self.tenant, self.credential.id)

    # ---------------------------------------------------------------------------- parameters
    def string(self, name: str, *, required: bool = True) -> str:
        value = self.params.get(name)
        if value is None:
            if required:
                raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
            return ""
        if not isinstance(value, str):
            raise SqsError("InvalidParameterValue", f"Value for parameter {name} must be a string.")
        return value

    def optional_string(self, name: str) -> str | None:
        return self.string(name, required=False) if self.params.get(name) is not None else None

    def integer(self, name: str, low: int, high: int, params: dict[str, Any] | None = None) -> int | None:
        value = (self.params if params is None else params).get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {value} for parameter {name} is invalid. Reason: Must be between {low} and {high}.",
            )
        return value

    def strings(self, name: str) -> list[str]:
        value = self.params.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SqsError("InvalidParameterValue", f"Value for parameter {name} must be a list of strings.")
        return value

    def mapping(self, name: str, *, required: bool = False) -> dict[str, Any]:
        value = self.params.get(name)
        if value is None:
            if required:
                raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
            return {}
        if not isinstance(value, dict):
            raise SqsError("InvalidParameterValue", f"Value for parameter {name} must be a map.")
        return value

    def entries(self, shape: str) -> list[dict[str, Any]]:
        """A batch's Entries, checked as SQS does: present, 1-10, distinct valid ids. `shape`: the entry's
        name in SQS's texts (`SendMessageBatchRequestEntry`)."""
        entries = self.params.get("Entries")
        if entries is None or entries == []:
            raise SqsError("EmptyBatchRequest", f"There should be at least one {shape} in the request.")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise SqsError(
                "InvalidParameterValue", "Value for parameter Entries must be a list of structures."
            )
        if len(entries) > 10:
            raise SqsError(
                "TooManyEntriesInBatchRequest",
                f"Maximum number of entries per request are 10. You have sent {len(entries)}.",
            )
        seen: set[str] = set()
        for entry in entries:
            entry_id = entry.get("Id")
            if not isinstance(entry_id, str) or not _valid_entry_id(entry_id):
                raise SqsError(
                    "InvalidBatchEntryId",
                    "A batch entry id can only contain alphanumeric characters, hyphens and underscores."
                    " It can be at most 80 letters long.",
                )
            if entry_id in seen:
                raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
            seen.add(entry_id)
        return entries

    # -------------------------------------------------------------------------------- queues
    async def queue(self, param: str = "QueueUrl") -> Queue:
        """The queue a QueueUrl names, in the forms SQS takes: `<endpoint>/<account>/<name>` (any host: the
        path names the queue) or a bare queue name. Anything else names no queue of this endpoint:
        QueueDoesNotExist (HTTP 400), as SQS answers `http://whatever-incorrect-queue-address`."""
        url = self.string(param)
        if CONTROL_RE.search(url):  # urlsplit drops CR, LF and TAB anywhere: `.../ta/s\nq1` would be `sq1`
            raise SqsError(
                "InvalidParameterValue", f"Value for parameter {param} must not contain control characters."
            )
        parts = urlsplit(url)
        if not parts.scheme and not parts.netloc and "/" not in url:
            return await self.queue_named(url)  # a bare name, as SQS accepts it
        segments = parts.path.strip("/").split("/")
        if len(segments) != 2 or not self.is_own_account(segments[0]):
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        return await self.queue_named(segments[1])

    async def queue_named(self, name: str, missing: str = "QueueDoesNotExist") -> Queue:
        try:
            internal = internal_name(self.credential, name)
            service = self.service(internal)
            attributes = await service.attributes(internal)
        except QueueNotFound:
            raise SqsError(missing, NO_QUEUE) from None
        return Queue(name, internal, attributes, service)

    async def queue_from_arn(self, arn: str, missing: str = "ResourceNotFoundException") -> Queue:
        parts = arn.split(":")
        regions = self.state.regions
        if (
            len(parts) != 6
            or parts[:3] != ["arn", "aws", "sqs"]
            or (regions is not None and parts[3] not in regions)
            or not self.is_own_account(parts[4])
        ):
            raise SqsError(missing, f"The resource {arn} does not exist.")
        try:
            return await self.queue_named(parts[5], missing)
        except SqsError:
            raise SqsError(missing, f"The resource {arn} does not exist.") from None


def _valid_entry_id(entry_id: str) -> bool:
    return 1 <= len(entry_id) <= 80 and all(c.isascii() and (c.isalnum() or c in "-_") for c in entry_id)
