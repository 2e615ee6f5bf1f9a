"""Hostile-but-authenticated fuzzing of both faces of a real `strictq serve` process (two tenants, real TLS).

Hypothesis builds requests near the valid ones (right routes, real keys, SigV4-signed SQS calls) with hostile
values where a client controls them: lone surrogates, control characters, trailing newlines, non-ASCII digits,
deep or odd JSON, wrong types; SQS queue attributes, redrive policies and Number attributes with odd
numbers, admin query strings, results with numbers beyond 64 bits or `1e999` (the issue 11 review's).
Every answer must be below 500 and, when it is an error, a JSON body; the server must stay ready; and
messages accepted before the run must still be there, unchanged, afterwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kit.process import CA, LISTENING, ChildProcess, launch, strictq

EXAMPLES = 150  # per face: a few hundred requests in all keep CI within seconds

KEYS_TOML = """
[[credential]]
id = "admin-a"
secret = "admin-a-secret-0123456789"
role = "admin"
tenant = "ta"

[[credential]]
id = "producer-a"
secret = "producer-a-secret-0123456789"
role = "producer"
tenant = "ta"

[[credential]]
id = "worker-a"
secret = "worker-a-secret-0123456789"
role = "worker"
tenant = "ta"

[[credential]]
id = "admin-b"
secret = "admin-b-secret-0123456789"
role = "admin"
tenant = "tb"

[[credential]]
id = "worker-b"
secret = "worker-b-secret-0123456789"
role = "worker"
tenant = "tb"
"""
SECRETS = {
    "admin-a": "admin-a-secret-0123456789",
    "producer-a": "producer-a-secret-0123456789",
    "worker-a": "worker-a-secret-0123456789",
    "admin-b": "admin-b-secret-0123456789",
    "worker-b": "worker-b-secret-0123456789",
}
# Messages sent before the fuzzing, on queues the fuzzer never names: they must survive it unchanged.
KEPT_QUEUE = "kept"
KEPT = {"ta": [{"n": i, "text": f"kept-a-{i}"} for i in range(5)], "tb": [{"n": i} for i in range(3)]}


@dataclass
class Serve:
    url: str
    http: urllib3.PoolManager
    process: ChildProcess

    def request(self, method: str, path: str, body: bytes | None = None, **headers: str) -> Any:
        return self.http.request(method, self.url + path, body=body, headers=headers, retries=False)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    keys = data_dir.parent / "keys.toml"
    keys.write_text(KEYS_TOML)
    process = launch(
        strictq("serve", "--port", "0", "--data-dir", str(data_dir), "--keys", str(keys), "--no-proxy"),
        data_dir.parent / "serve.log",
        wait_for=(LISTENING, CA),
    )
    url, ca = process.startup[LISTENING], process.startup[CA]
    http = urllib3.PoolManager(ca_certs=ca, timeout=urllib3.Timeout(connect=5, read=15))
    try:
        yield Serve(url.rstrip("/"), http, process)
    finally:
        http.clear()
        process.stop()


def emodb(serve: Serve, method: str, path: str, key: str | None, body: bytes | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["X-BV-API-Key"] = key
    return serve.request(method, path, body, **headers)


def sqs(serve: Serve, key_id: str, action: str, body: bytes) -> Any:
    request = AWSRequest(
        method="POST",
        url=serve.url + "/",
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"},
    )
    SigV4Auth(Credentials(key_id, SECRETS[key_id]), "sqs", "us-east-1").add_auth(request)
    return serve.request("POST", "/", body, **dict(request.headers.items()))


@pytest.fixture(scope="module")
def kept(serve: Serve) -> dict[str, list[Any]]:
    """The messages accepted before fuzzing, per tenant."""
    for tenant, admin in (("ta", "admin-a"), ("tb", "admin-b")):
        for message in KEPT[tenant]:
            answer = emodb(
                serve, "POST", f"/queue/1/{KEPT_QUEUE}/send", SECRETS[admin], json.dumps(message).encode()
            )
            assert answer.status == 200, answer.data
    return KEPT


def assert_sound(answer: Any, what: str) -> None:
    """No 5xx; an error carries a JSON body (the SQS face's AWS JSON or the EmoDB / admin shape)."""
    assert answer.status < 500, f"{what} -> {answer.status} {answer.data[:300]!r}"
    if answer.status >= 400:
        try:
            json.loads(answer.data)
        except ValueError:
            pytest.fail(f"{what} -> {answer.status} without a JSON body: {answer.data[:300]!r}")


def assert_intact(serve: Serve) -> None:
    ready = serve.request("GET", "/readyz")
    assert ready.status == 200, ready.data
    for tenant, admin in (("ta", "admin-a"), ("tb", "admin-b")):
        answer = emodb(serve, "GET", f"/queue/1/{KEPT_QUEUE}/peek?limit=100", SECRETS[admin])
        assert answer.status == 200, answer.data
        assert [item["payload"] for item in json.loads(answer.data)] == KEPT[tenant]
    assert serve.process.running(), serve.process.log()


# ------------------------------------------------------------------------------------------- strategies
HOSTILE_TEXT = st.sampled_from(
    [
        "\ud800",
        "bad \udfff",
        "x\n",
        "x\r\nInjected: 1",
        "\x00",
        "\x1b[31mred",
        "٣",
        "\u00b2",  # isdigit() but not int(): the review's 500s
        "\uff15",
        "\u0661\u0662\u0660\u0660",
        "1_0",
        " 5",
        "1e3",
        "nan",
        "-1",
        "9" * 40,
        "",
        " ",
        "../..",
        "%0A",
        "a" * 300,
        "ok",
        "g1",
        "\u202e",
    ]
)
TEXT = st.one_of(HOSTILE_TEXT, st.text(max_size=20))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
QUEUE_NAMES = st.one_of(st.sampled_from(["orders", "q1", "dd"]), TEXT).filter(lambda n: n != KEPT_QUEUE)
KEYS = st.sampled_from([*SECRETS.values(), None, "nope-nope-nope-nope", "caf\xe9-not-ascii"])
INFINITE = "__1e999__"  # replaced by the JSON number 1e999 (the stdlib parses it as inf) in the sent body
# Numbers near and past what a JSON peer holds (64 bits; doubles), and odd numbers as text.
NUMBERS = st.one_of(
    st.sampled_from([10**29, -(10**29), 2**63, 2**63 - 1, 2**64, -(2**63) - 1, 1.5, 0, INFINITE]),
    st.integers(),
)
NUMBER_TEXT = st.one_of(
    st.sampled_from(
        ["\u00b2", "\u0663", "\uff15", "\u0661\u0662\u0660\u0660", " 5", "1_0", "+5", "0x10", "9" * 5000]
    ),
    st.integers(-5, 2000).map(str),
    TEXT,
)
SQS_NUMERIC_ATTRIBUTES = [
    "VisibilityTimeout",
    "DelaySeconds",
    "MessageRetentionPeriod",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
    "KmsDataKeyReusePeriodSeconds",
]


def dumps(value: Any) -> bytes:
    """JSON text as a client would send it; lone surrogates go out as `\\udxxx` escapes (valid JSON)."""
    return json.dumps(value).encode().replace(f'"{INFINITE}"'.encode(), b"1e999")


def segment(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def emodb_calls(draw: st.DrawFn) -> tuple[str, str, str | None, bytes | None]:
    face = draw(st.sampled_from(["/queue/1", "/dedupq/1"]))
    queue = segment(draw(QUEUE_NAMES))
    route = draw(
        st.sampled_from(
            [
                ("POST", "send"),
                ("POST", "_sendbatch"),
                ("GET", "poll"),
                ("POST", "ack"),
                ("POST", "renew"),
                ("POST", "results"),
                ("GET", "peek"),
                ("GET", "size"),
                ("GET", "claimcount"),
                ("POST", "purge"),
                ("POST", "unclaimall"),
                ("POST", "_move"),
                ("PUT", "send"),
            ]
        )
    )
    method, action = route
    path = f"{face}/_sendbatch" if action == "_sendbatch" else f"{face}/{queue}/{action}"
    if action == "_move":
        path = f"{face}/_move?from={queue}&to={segment(draw(QUEUE_NAMES))}"
    params = draw(
        st.dictionaries(
            # never `wait`: each example answers at once, no long poll
            st.sampled_from(["ttl", "limit", "group", "token", "dedup"]),
            TEXT.map(segment),
            max_size=3,
        )
    )
    if params:
        path += ("&" if "?" in path else "?") + "&".join(f"{k}={v}" for k, v in params.items())
    body_kind = draw(st.sampled_from(["json", "ids", "results", "raw", "none"]))
    body: bytes | None
    if body_kind == "json":
        body = dumps(draw(JSON_VALUES))
    elif body_kind == "ids":
        body = dumps(draw(st.lists(TEXT, max_size=4)))
    elif body_kind == "results":
        item = draw(
            st.fixed_dictionaries(
                {
                    "id": TEXT,
                    "outcome": st.sampled_from(["succeeded", "failed", "partial", "not_attempted", "x"]),
                },
                optional={
                    "token": SCALARS,
                    "reason": TEXT,
                    "signature": TEXT,
                    "steps": st.one_of(
                        JSON_VALUES, st.lists(st.fixed_dictionaries({"name": TEXT, "result": NUMBERS}))
                    ),
                    "fields": st.one_of(JSON_VALUES, st.dictionaries(TEXT, NUMBERS, max_size=3)),
                    "partial": st.one_of(JSON_VALUES, NUMBERS),
                    "duration_ms": NUMBERS,
                },
            )
        )
        body = dumps({"results": [item]})
    elif body_kind == "raw":
        body = draw(st.binary(max_size=64))
    else:
        body = None
    return method, path, draw(KEYS), body


SQS_ACTIONS = [
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "CreateQueue",
    "GetQueueUrl",
    "GetQueueAttributes",
    "SetQueueAttributes",
    "ListQueues",
    "PurgeQueue",
    "TagQueue",
]


# The fields a call of these actions needs, so that its odd numbers reach the code that parses them.
FOCUSED = {
    "CreateQueue": {"QueueName", "Attributes"},
    "SetQueueAttributes": {"QueueUrl", "Attributes"},
    "SendMessage": {"QueueUrl", "MessageBody", "MessageAttributes"},
}


def redrive_policies(tenant: str) -> st.SearchStrategy[str]:
    """RedrivePolicy texts: the right shape with odd maxReceiveCount values, and broken JSON."""
    count = st.one_of(NUMBER_TEXT, NUMBERS.filter(lambda n: n != INFINITE))
    arn = f"arn:aws:sqs:us-east-1:{tenant}:orders"
    policies = count.map(lambda n: json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": n}))
    return st.one_of(policies, TEXT)


@st.composite
def admin_calls(draw: st.DrawFn) -> tuple[str, str, str | None]:
    """Admin routes with hostile query strings (numbers above all): the review's 500 was `limit=²`."""
    queue = segment(draw(st.one_of(st.just(KEPT_QUEUE), st.sampled_from(["orders", KEPT_QUEUE]), TEXT)))
    route = draw(
        st.sampled_from(
            [
                ("GET", "/admin/v1/events"),
                ("GET", "/admin/v1/status"),
                ("GET", "/admin/v1/fences"),
                ("GET", "/admin/v1/search"),
                ("GET", f"/admin/v1/queues/{queue}/groups/log"),
                ("GET", f"/admin/v1/queues/{queue}/groups/policy"),
                ("GET", f"/admin/v1/queues/{queue}/parked"),
            ]
        )
    )
    params = draw(
        st.dictionaries(
            st.sampled_from(["since", "until", "limit", "events", "group", "message_id", "worker", "status"]),
            st.one_of(NUMBER_TEXT, st.sampled_from(["9" * 400 + "d", "1e999d", "15m", "0"])).map(segment),
            max_size=3,
        )
    )
    if "/groups/" in route[1] and draw(st.booleans()):
        params["group"] = "g1"  # a group that exists in `kept`, so `limit` is what is read next
    path = route[1] + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
    key = draw(st.sampled_from([SECRETS["admin-a"], SECRETS["admin-b"], SECRETS["worker-a"], None]))
    return route[0], path, key


@st.composite
def sqs_calls(draw: st.DrawFn) -> tuple[str, str, bytes]:
    action = draw(st.sampled_from(SQS_ACTIONS))
    name = draw(QUEUE_NAMES)
    key_id = draw(st.sampled_from(sorted(SECRETS)))
    tenant = "ta" if key_id.endswith("-a") else "tb"
    fields: dict[str, Any] = {
        "QueueUrl": draw(
            st.sampled_from([f"https://127.0.0.1/{tenant}/{name}", f"https://127.0.0.1/ta/{name}", name, ""])
        ),
        "QueueName": name,
        "MessageBody": draw(TEXT),
        "MessageGroupId": draw(TEXT),
        "MessageDeduplicationId": draw(TEXT),
        "ReceiptHandle": draw(TEXT),
        "DelaySeconds": draw(SCALARS),
        "MaxNumberOfMessages": draw(SCALARS),
        "VisibilityTimeout": draw(SCALARS),
        "Attributes": draw(
            st.one_of(
                st.dictionaries(TEXT, TEXT, max_size=2),
                st.dictionaries(st.sampled_from(SQS_NUMERIC_ATTRIBUTES), NUMBER_TEXT, min_size=1, max_size=3),
                st.fixed_dictionaries({"RedrivePolicy": redrive_policies(tenant)}),
            )
        ),
        "MessageAttributes": draw(
            st.dictionaries(
                TEXT,
                st.fixed_dictionaries(
                    {"DataType": st.one_of(st.just("Number"), TEXT), "StringValue": NUMBER_TEXT}
                ),
                max_size=2,
            )
        ),
        "MessageSystemAttributes": draw(
            st.dictionaries(
                st.just("AWSTraceHeader"),
                st.fixed_dictionaries({"DataType": st.just("String"), "StringValue": TEXT}),
                max_size=1,
            )
        ),
        "tags": draw(st.dictionaries(TEXT, TEXT, max_size=2)),
        "Entries": [
            {"Id": draw(TEXT), "MessageBody": draw(TEXT), "ReceiptHandle": draw(TEXT)}
            for _ in range(draw(st.integers(0, 3)))
        ],
        "Tags": draw(st.dictionaries(TEXT, TEXT, max_size=2)),
    }
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=6))
    if action in FOCUSED and draw(st.booleans()):  # half of these calls are well-formed but for the values
        chosen = sorted(set(chosen) | FOCUSED[action])
    body = (
        dumps({name: fields[name] for name in chosen})
        if draw(st.booleans())
        else draw(st.binary(max_size=40))
    )
    return key_id, action, body


@st.composite
def sqs_number_calls(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """Well-formed SQS calls whose numbers are odd: the review's 500s were `VisibilityTimeout: "²"` and
    `maxReceiveCount: "²"` (`isdigit()` is true, `int()` refuses it)."""
    action = draw(st.sampled_from(["CreateQueue", "SetQueueAttributes", "SendMessage"]))
    key_id = draw(st.sampled_from(["admin-a", "producer-a", "admin-b"]))
    tenant = "ta" if key_id.endswith("-a") else "tb"
    name = draw(st.sampled_from(["orders", "numbers"]))
    attributes = draw(
        st.one_of(
            st.dictionaries(st.sampled_from(SQS_NUMERIC_ATTRIBUTES), NUMBER_TEXT, min_size=1, max_size=2),
            st.fixed_dictionaries({"RedrivePolicy": redrive_policies(tenant)}),
        )
    )
    fields: dict[str, Any] = {"QueueName": name, "Attributes": attributes}
    if action != "CreateQueue":
        fields = {"QueueUrl": f"https://127.0.0.1/{tenant}/{name}"}
        if action == "SetQueueAttributes":
            fields["Attributes"] = attributes
        else:
            data_type = draw(st.sampled_from(["Number", "Number.int"]))
            number = {"DataType": data_type, "StringValue": draw(NUMBER_TEXT)}
            fields |= {"MessageBody": "x", "MessageAttributes": {"n": number}}
    return key_id, action, dumps(fields)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples every run: CI failures reproduce
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# ------------------------------------------------------------------------------------------------ tests
@FUZZ
@given(call=emodb_calls())
def test_emodb_face_never_fails_the_server(serve: Serve, kept: dict[str, list[Any]], call: Any) -> None:
    method, path, key, body = call
    answer = emodb(serve, method, path, key, body)
    assert_sound(answer, f"{method} {path} body={body!r:.200}")


@FUZZ
@given(call=sqs_calls())
def test_sqs_face_never_fails_the_server(serve: Serve, kept: dict[str, list[Any]], call: Any) -> None:
    key_id, action, body = call
    answer = sqs(serve, key_id, action, body)
    assert_sound(answer, f"{action} by {key_id} body={body!r:.200}")


@FUZZ
@given(call=admin_calls())
def test_admin_routes_never_fail_the_server(serve: Serve, kept: dict[str, list[Any]], call: Any) -> None:
    method, path, key = call
    answer = emodb(serve, method, path, key)
    assert_sound(answer, f"{method} {path}")


@FUZZ
@given(call=sqs_number_calls())
def test_sqs_numbers_never_fail_the_server(serve: Serve, kept: dict[str, list[Any]], call: Any) -> None:
    key_id, action, body = call
    answer = sqs(serve, key_id, action, body)
    assert_sound(answer, f"{action} by {key_id} body={body!r:.200}")


@pytest.mark.parametrize("path", ["/admin/v1/nothing", "/queue/1/q/unknown-route", "/nothing"])
def test_unknown_routes_answer_json(serve: Serve, path: str) -> None:
    for method in ("GET", "DELETE"):
        answer = emodb(serve, method, path, SECRETS["admin-a"])
        assert answer.status in (404, 405), answer.status
        assert json.loads(answer.data), answer.data


def test_after_fuzzing_the_server_is_ready_and_kept_messages_are_intact(
    serve: Serve, kept: dict[str, list[Any]]
) -> None:
    # Runs after the fuzz tests of this module (pytest keeps file order): the server took them all.
    assert_intact(serve)
    log = serve.process.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
    assert not re.search(r" ERROR ", log), log[-4000:]
