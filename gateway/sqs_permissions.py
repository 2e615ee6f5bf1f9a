"""AddPermission and RemovePermission: SQS's shorthand for editing a queue's access policy.

As in SQS, AddPermission adds one statement (its `Sid` is the label) to the queue's `Policy` attribute,
creating the policy `<queue arn>/SQSDefaultPolicy` when the queue has none, and RemovePermission removes
the statement with that label; GetQueueAttributes shows the result as `Policy`. The policy is kept where
SetQueueAttributes keeps it (the queue's `sqs:Policy` label, durable in the store).

It is bookkeeping only: a strictq endpoint is tenant-scoped, so who may call what on a queue is decided by
the key file's credentials (role, tenant, queue names; docs/security.md), never by a queue policy. A
statement naming another account grants that account nothing here.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from .sqs_admin import update_queue
from .sqs_call import Call
from .sqs_errors import SqsError
from .sqs_queues import LABEL

POLICY_LABEL = f"{LABEL}Policy"
LABEL_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
ACCOUNT_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a 12-digit AWS account id, or a strictq tenant name
MAX_ACTIONS = 7  # "An Amazon SQS policy can have a maximum of seven actions per statement."
# The actions a permission may name (SQS's list); batch actions come with their single forms.
ACTIONS = frozenset(
    [
        "*",
        "ChangeMessageVisibility",
        "DeleteMessage",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ReceiveMessage",
        "SendMessage",
    ]
)
OWNER_ONLY = frozenset(
    ["AddPermission", "RemovePermission", "SetQueueAttributes", "DeleteQueue", "CreateQueue", "TagQueue"]
)

Result = dict[str, Any]


async def add_permission(call: Call) -> Result:
    queue = await call.queue()
    label = _label(call)
    accounts = call.strings("AWSAccountIds")
    if not accounts:
        raise SqsError(
            "InvalidParameterValue",
            "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.",
        )
    for account in accounts:
        if not ACCOUNT_RE.fullmatch(account):
            raise SqsError(
                "InvalidParameterValue",
                f"Value {_shown(account)} for parameter PrincipalId is invalid. Reason: Unable to verify.",
            )
    actions = call.strings("Actions")
    if not actions:
        raise SqsError("MissingParameter", "The request must contain the parameter Actions.")
    if len(actions) > MAX_ACTIONS:
        raise SqsError("OverLimit", f"{len(actions)} Actions were found, maximum allowed is {MAX_ACTIONS}.")
    for action in actions:
        if action in OWNER_ONLY:
            raise SqsError(
                "InvalidParameterValue",
                f"Value SQS:{action} for parameter ActionName is invalid. Reason: Only the queue owner is"
                " allowed to invoke this action.",
            )
        if action not in ACTIONS:
            raise SqsError(
                "InvalidParameterValue",
                f"Value SQS:{_shown(action)} for parameter ActionName is invalid. Reason: Please refer to the"
                " appropriate WSDL for a list of valid actions.",
            )
    arn = call.arn(queue.name)
    policy = _policy(queue.attributes.labels.get(POLICY_LABEL)) or {
        "Version": "2012-10-17",
        "Id": f"{arn}/SQSDefaultPolicy",
        "Statement": [],
    }
    statements: list[Any] = policy["Statement"]
    if any(isinstance(s, dict) and s.get("Sid") == label for s in statements):
        raise SqsError(
            "InvalidParameterValue", f"Value {label} for parameter Label is invalid. Reason: Already exists."
        )
    principals = [f"arn:aws:iam::{a}:root" for a in accounts]
    names = [f"SQS:{a}" for a in actions]
    statements.append(
        {
            "Sid": label,
            "Effect": "Allow",
            "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
            "Action": names[0] if len(names) == 1 else names,
            "Resource": arn,
        }
    )
    await update_queue(queue, {}, {POLICY_LABEL: orjson.dumps(policy).decode()})
    return {}


async def remove_permission(call: Call) -> Result:
    queue = await call.queue()
    label = _label(call)
    policy = _policy(queue.attributes.labels.get(POLICY_LABEL))
    statements: list[Any] = policy["Statement"] if policy is not None else []
    kept = [s for s in statements if not (isinstance(s, dict) and s.get("Sid") == label)]
    if policy is None or len(kept) == len(statements):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {label} for parameter Label is invalid. Reason: can't find label on existing policy.",
        )
    policy["Statement"] = kept
    # The last statement gone, the queue has no policy again (GetQueueAttributes shows none, as before).
    await update_queue(queue, {}, {POLICY_LABEL: orjson.dumps(policy).decode() if kept else None})
    return {}


def _label(call: Call) -> str:
    label = call.string("Label")
    if not LABEL_RE.fullmatch(label):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {_shown(label)} for parameter Label is invalid. Reason: Can only include alphanumeric"
            " characters, hyphens, or underscores. 1 to 80 in length.",
        )
    return label


def _policy(stored: str | None) -> dict[str, Any] | None:
    """The queue's policy as a document AddPermission can extend; None when it has none. A policy set by
    SetQueueAttributes that is not a JSON object with a Statement list cannot be edited this way."""
    if stored is None:
        return None
    try:
        policy = orjson.loads(stored)
    except orjson.JSONDecodeError:
        policy = None
    if isinstance(policy, dict) and isinstance(policy.get("Statement", []), list):
        policy.setdefault("Statement", [])
        return policy
    raise SqsError(
        "InvalidAttributeValue",
        "The queue's Policy is not a JSON policy document with a Statement list: set it with"
        " SetQueueAttributes.",
    )


def _shown(value: str) -> str:
    return value[:128].encode("ascii", "backslashreplace").decode("ascii")
