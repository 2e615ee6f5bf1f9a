"""SQS errors as the AWS JSON protocol carries them, and the ONE table from the core's error codes to them.

An SQS error over JSON is an HTTP status, a body `{"__type": "<namespace>#<shape>", "message": ...}` and the
header `x-amzn-query-error: <query code>;<Sender|Receiver>`. botocore picks the exception class from the
shape (`client.exceptions.QueueDoesNotExist`) and shows the query code as `response["Error"]["Code"]`
(`AWS.SimpleQueueService.NonExistentQueue`); errors without a modeled shape raise a plain ClientError with
that code (`InvalidParameterValue`, `AccessDenied`, ...). Statuses and codes follow SQS's Smithy model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from protocol import headers
from queue_core.machine import QueueError

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
SQS = "com.amazonaws.sqs"
CORAL = "com.amazon.coral.service"


@dataclass(frozen=True, slots=True)
class Kind:
    shape: str  # after the '#' of __type: the botocore exception name for modeled errors
    query_code: str  # x-amzn-query-error code: what ClientError.response["Error"]["Code"] shows
    status: int
    namespace: str = SQS
    sender_fault: bool = True

    @property
    def batch_code(self) -> str:
        """The code a batch's Failed entry carries (the query code without the service prefix)."""
        return self.query_code.removeprefix("AWS.SimpleQueueService.")


_KINDS = [
    # modeled in botocore's SQS service (client.exceptions.<shape>)
    Kind("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", 400),
    Kind("QueueNameExists", "QueueAlreadyExists", 400),
    Kind("QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently", 400),
    Kind("BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    Kind("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", 400),
    Kind("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", 400),
    Kind("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    Kind("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    Kind("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", 400),
    Kind("PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    Kind("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", 400),
    Kind("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 404),
    Kind("InvalidIdFormat", "InvalidIdFormat", 400),
    Kind("InvalidMessageContents", "InvalidMessageContents", 400),
    Kind("InvalidAttributeName", "InvalidAttributeName", 400),
    Kind("InvalidAttributeValue", "InvalidAttributeValue", 400),
    Kind("InvalidAddress", "InvalidAddress", 404),
    Kind("InvalidSecurity", "InvalidSecurity", 403),
    Kind("OverLimit", "OverLimit", 403),
    Kind("RequestThrottled", "RequestThrottled", 403),
    Kind("ResourceNotFoundException", "ResourceNotFoundException", 404),
    # common AWS errors (not modeled: botocore raises ClientError with the query code)
    Kind("InvalidParameterValueException", "InvalidParameterValue", 400),
    Kind("MissingRequiredParameterException", "MissingParameter", 400),
    Kind("SerializationException", "SerializationException", 400, CORAL),
    Kind("UnknownOperationException", "InvalidAction", 400, CORAL),
    Kind("AccessDeniedException", "AccessDenied", 403, CORAL),
    Kind("MissingAuthenticationTokenException", "MissingAuthenticationToken", 403, CORAL),
    Kind("IncompleteSignatureException", "IncompleteSignature", 400, CORAL),
    Kind("InvalidClientTokenId", "InvalidClientTokenId", 403, CORAL),
    Kind("SignatureDoesNotMatch", "SignatureDoesNotMatch", 403, CORAL),
    Kind("InternalFailure", "InternalError", 500, CORAL, sender_fault=False),
    Kind("ServiceUnavailable", "ServiceUnavailable", 503, CORAL, sender_fault=False),
]
# Looked up by shape and by query code, so code can say either "QueueDoesNotExist" or "InvalidParameterValue".
KINDS: dict[str, Kind] = {k.shape: k for k in _KINDS} | {k.query_code: k for k in _KINDS}


class SqsError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = KINDS[kind]
        self.message = message

    def batch_entry(self, entry_id: str) -> dict[str, Any]:
        return {
            "Id": entry_id,
            "SenderFault": self.kind.sender_fault,
            "Code": self.kind.batch_code,
            "Message": self.message,
        }


NO_QUEUE = "The specified queue does not exist."

# The one place core error codes (queue_core/machine/errors.py, and AckOutcome statuses) become SQS errors:
# code -> (SQS kind, message to use instead of the core's, or None to pass the core's message on). Messages
# that would name internal `<tenant>.<queue>` names are replaced.
CORE_ERRORS: dict[str, tuple[str, str | None]] = {
    "queue_not_found": ("QueueDoesNotExist", NO_QUEUE),
    "not_found": ("ResourceNotFoundException", "The resource that you specified does not exist."),
    "invalid_argument": ("InvalidParameterValue", None),
    "invalid_receipt": ("ReceiptHandleIsInvalid", "The input receipt handle is not a valid receipt handle."),
    "already_exists": (
        "QueueNameExists",
        "A queue already exists with the same name and a different value for an attribute.",
    ),
    "stale_claim": (
        "ReceiptHandleIsInvalid",
        "The receipt handle is no longer valid: the message was received again since (its claim was"
        " superseded by a newer fencing token).",
    ),
    "not_in_flight": ("MessageNotInflight", "The message referred to isn't in flight."),
    "too_large": ("InvalidParameterValue", None),
    "limit_exceeded": ("OverLimit", None),
    "unavailable": ("ServiceUnavailable", None),
    # AckOutcome "gone" where the action cannot succeed silently (ChangeMessageVisibility): as SQS says it.
    "gone": (
        "InvalidParameterValue",
        "Value for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available"
        " for visibility timeout change.",
    ),
}


def from_core_code(code: str, message: str = "") -> SqsError:
    kind, fixed = CORE_ERRORS.get(code, ("InternalError", "The queue core failed to process the request."))
    return SqsError(kind, fixed if fixed is not None else message)


def from_core(error: QueueError) -> SqsError:
    return from_core_code(error.code, error.message)


def json_response(payload: dict[str, Any], request_id: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload),
        content_type=JSON_CONTENT_TYPE,
        headers={headers.AMZN_REQUEST_ID: request_id},
    )


def error_response(error: SqsError, request_id: str) -> web.Response:
    kind = error.kind
    body = {"__type": f"{kind.namespace}#{kind.shape}", "message": error.message}
    fault = "Sender" if kind.sender_fault else "Receiver"
    return web.Response(
        status=kind.status,
        body=orjson.dumps(body),
        content_type=JSON_CONTENT_TYPE,
        headers={
            headers.AMZN_REQUEST_ID: request_id,
            "x-amzn-query-error": f"{kind.query_code};{fault}",
        },
    )
