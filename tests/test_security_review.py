"""Issue 11, part T: the adversarial review's findings (1-10) as regressions through the real servers.

A real `strictq serve` process (two tenants, real TLS; and one with `--queue-server` in front of a real
`strictq queue-server`), raw SigV4-signed SQS calls, raw sockets for aborted bodies and malformed heads,
start-up faults as subprocesses. Each test names the finding it pins. The server's log must never show an
ERROR line or a traceback for what a client sent.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import sqlite3
import ssl
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from conftest import ChildProcess, ServerProcess, start_server
from kit.process import CA, LISTENING, launch, strictq
from kit.secret import internal_headers
from kit.until import until_sync
from test_security_files import (
    _drop_root,
    assert_one_line_fault,
    make_store,
    private_data_dir,
    run_fault,
    serve_argv,
)

from wirelog.reader import read_records

START_TIMEOUT = 60.0
CREDENTIALS = (
    ("a-admin", "admin", "ta"),
    ("a-prod", "producer", "ta"),
    ("a-work", "worker", "ta"),
    ("b-admin", "admin", "tb"),
    ("b-prod", "producer", "tb"),
)
KEYS_TOML = "".join(
    f'[[credential]]\nid = "{key_id}"\nsecret = "{key_id}-secret-0123456789"\n'
    f'role = "{role}"\ntenant = "{tenant}"\n\n'
    for key_id, role, tenant in CREDENTIALS
)


def secret(key_id: str) -> str:
    return f"{key_id}-secret-0123456789"


# ------------------------------------------------------------------------------------------ processes
@dataclass
class Server:
    """A running `strictq serve` (TLS) or `strictq queue-server` (plain HTTP) and its log."""

    process: ChildProcess
    host: str
    port: int
    ca: Path | None  # None: plain HTTP
    data_dir: Path

    def connect(self, timeout: float = 15.0) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        if self.ca is None:
            return sock
        context = ssl.create_default_context(cafile=str(self.ca))
        return context.wrap_socket(sock, server_hostname=self.host)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        """(status, content type, body); a fresh connection each time (to a queue server: with the run's
        internal secret)."""
        if self.ca is None:
            headers = {**internal_headers(), **(headers or {})}
            conn: http.client.HTTPConnection = http.client.HTTPConnection(self.host, self.port, timeout=15)
        else:
            context = ssl.create_default_context(cafile=str(self.ca))
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=15, context=context)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, answer.getheader("Content-Type") or "", answer.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["X-BV-API-Key"] = secret(key)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        status, content_type, raw = self.request(method, path, data, headers)
        assert content_type.startswith("application/"), (status, content_type, raw[:300])
        return status, json.loads(raw) if raw else None

    def sqs(self, key_id: str, action: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body = json.dumps(params).encode()
        request = AWSRequest(
            method="POST",
            url=f"https://{self.host}:{self.port}/",
            data=body,
            headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"},
        )
        SigV4Auth(Credentials(key_id, secret(key_id)), "sqs", "us-east-1").add_auth(request)
        status, _, raw = self.request("POST", "/", body, dict(request.headers.items()))
        return status, json.loads(raw)

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


def _start_serve(tmp: Path, *extra: str) -> Server:
    data_dir = tmp / "data"
    keys = tmp / "keys.toml"
    keys.write_text(KEYS_TOML)
    keys.chmod(0o600)
    command = strictq("serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir))
    command += ["--keys", str(keys), "--no-proxy", *extra]
    process = launch(command, tmp / "serve.log", wait_for=[LISTENING, CA])
    host, port = process.startup[LISTENING].split("//", 1)[1].rsplit(":", 1)
    return Server(process, host, int(port), Path(process.startup[CA]), data_dir)


def _stop(process: ChildProcess) -> None:
    process.stop()


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _start_serve(tmp_path_factory.mktemp("review"))
    try:
        yield server
    finally:
        _stop(server.process)


@pytest.fixture(scope="module")
def queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("review-qs") / "data")
    try:
        yield server
    finally:
        _stop(server)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, queue_server: ServerProcess) -> Iterator[Server]:
    server = _start_serve(tmp_path_factory.mktemp("review-remote"), "--queue-server", queue_server.url)
    try:
        yield server
    finally:
        _stop(server.process)


def internal(queue_server: ServerProcess) -> Server:
    host, port = queue_server.url.split("//", 1)[1].rsplit(":", 1)
    return Server(queue_server, host, int(port), None, queue_server.data_dir)


def clean_log(server: Server, since: int) -> str:
    """The log written after offset `since`: no ERROR line and no traceback (client input never is)."""
    added = server.log()[since:]
    assert "Traceback" not in added, added[-3000:]
    assert not [line for line in added.splitlines() if " ERROR " in line], added[-3000:]
    return added


def sqs_code(answer: tuple[int, dict[str, Any]]) -> tuple[int, str]:
    status, body = answer
    return status, str(body.get("__type", "")).rpartition("#")[2].removesuffix("Exception")


# ------------------------------------------------------------------- 1, 6: numbers as ASCII digits only
ODD_NUMBERS = ["\u00b2", "\u0663", "\uff15", "\u0661\u0662\u0660\u0660", " 5", "1_0", "+5", "9" * 5000]


def test_sqs_queue_attribute_numbers_are_ascii_digits(serve: Server) -> None:
    since = len(serve.log())
    for value in ODD_NUMBERS:
        answer = serve.sqs(
            "a-prod", "CreateQueue", {"QueueName": "v1", "Attributes": {"VisibilityTimeout": value}}
        )
        assert sqs_code(answer) == (400, "InvalidAttributeValue"), (value, answer)
    assert (
        serve.sqs("a-admin", "CreateQueue", {"QueueName": "v1", "Attributes": {"DelaySeconds": "3"}})[0]
        == 200
    )
    url = f"https://{serve.host}:{serve.port}/ta/v1"
    for value in ODD_NUMBERS:
        answer = serve.sqs(
            "a-admin", "SetQueueAttributes", {"QueueUrl": url, "Attributes": {"DelaySeconds": value}}
        )
        assert sqs_code(answer) == (400, "InvalidAttributeValue"), (value, answer)
        policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:ta:v1", "maxReceiveCount": value})
        answer = serve.sqs(
            "a-prod", "CreateQueue", {"QueueName": "v2", "Attributes": {"RedrivePolicy": policy}}
        )
        assert sqs_code(answer) == (400, "InvalidAttributeValue"), (value, answer)
    for value in ["\u0663", "\uff15", "1\u0663.5", "\u00b2"]:
        attribute = {"n": {"DataType": "Number", "StringValue": value}}
        answer = serve.sqs(
            "a-prod", "SendMessage", {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": attribute}
        )
        assert sqs_code(answer) == (400, "InvalidParameterValue"), (value, answer)
    attribute = {"n": {"DataType": "Number", "StringValue": "-1.5e3"}}
    answer = serve.sqs(
        "a-prod", "SendMessage", {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": attribute}
    )
    assert answer[0] == 200, answer
    clean_log(serve, since)


def test_admin_query_numbers_are_ascii_digits(serve: Server) -> None:
    since = len(serve.log())
    assert serve.json("POST", "/queue/1/vq/send?group=g1", "a-prod", {"n": 1})[0] == 200
    base = "/admin/v1/queues/vq/groups/log?group=g1&limit="
    for raw in ("%C2%B2", "%D9%A3", "1_0", "%205", "+5"):
        status, body = serve.json("GET", base + raw, "a-admin")
        error = body["error"]
        assert status == 400 and error["code"] == "invalid_argument" and "limit" in error["message"], (
            raw,
            body,
        )
    assert serve.json("GET", base + "5", "a-admin")[0] == 200
    for path in (
        "/admin/v1/events?since=%D9%A3",
        "/admin/v1/events?limit=1_0",
        "/admin/v1/events?since=%C2%B2",
        "/admin/v1/status?events=%20%205",
        "/admin/v1/status?events=%EF%BC%95",
    ):
        status, body = serve.json("GET", path, "a-admin")
        assert status == 400 and body["error"]["code"].startswith("bad_"), (path, body)
    assert serve.json("GET", "/admin/v1/events?since=0&limit=10", "a-admin")[0] == 200
    assert serve.json("GET", "/admin/v1/status?events=5", "a-admin")[0] == 200
    clean_log(serve, since)


def _first_frame(server: Server, last_event_id: str | None = None) -> tuple[str, str]:
    """(id, event) of the first frame of the control stream for `a-admin`, resuming at `last_event_id`."""
    head = f"GET /admin/v1/control HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {secret('a-admin')}\r\n"
    if last_event_id is not None:
        head += f"Last-Event-ID: {last_event_id}\r\n"
    frame = re.compile(rb"\nid: ([^\n]*)\nevent: ([^\n]*)\n")
    with server.connect() as sock:
        sock.sendall((head + "\r\n").encode())
        data = b""
        while (match := frame.search(data)) is None:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    return match.group(1).decode(), match.group(2).decode()


def test_control_stream_resume_ids_are_ascii_digits(serve: Server) -> None:
    event_id, event = _first_frame(serve)
    assert event == "snapshot"
    assert _first_frame(serve, event_id)[1] != "snapshot"  # a real id resumes (no snapshot)
    instance, _, n = event_id.rpartition("-")

    def digits(text: str, zero: int) -> str:
        return "".join(chr(zero + int(d)) for d in text)

    for odd in (
        f"{instance}-{digits(n, 0x0660)}",
        f"{digits(instance, 0x0660)}-{n}",
        f"{instance}-{digits(n, 0xFF10)}",
    ):
        assert _first_frame(serve, odd)[1] == "snapshot", odd


# -------------------------------------------------------------------- 2: numbers no JSON peer can hold
BIG = 10**29


def _claim(server: Server, queue: str) -> dict[str, Any]:
    assert server.json("POST", f"/queue/1/{queue}/send?group=g1", "a-prod", {"n": 1})[0] == 200
    status, polled = server.json("GET", f"/queue/1/{queue}/poll?ttl=60&limit=1", "a-work")
    assert status == 200 and len(polled) == 1, polled
    return dict(polled[0])


def _results(server: Server, queue: str, item: dict[str, Any], extra: str) -> tuple[int, Any]:
    head = f'{{"results":[{{"id":{json.dumps(item["id"])},"token":{item["token"]},"outcome":"succeeded"'
    raw = head + extra + "}]}"
    return server.json("POST", f"/queue/1/{queue}/results", "a-work", raw.encode())


@pytest.mark.parametrize("mode", ["embedded", "remote"])
def test_result_numbers_beyond_64_bits_are_refused_naming_the_field(
    mode: str, serve: Server, remote: Server
) -> None:
    server = serve if mode == "embedded" else remote
    since = len(server.log())
    item = _claim(server, f"big-{mode}")
    for extra, field in (
        (f',"fields":{{"a":{BIG}}}', "fields"),
        (f',"fields":{{"a":{-BIG}}}', "fields"),
        (',"fields":{"a":[1,{"b":18446744073709551615}]}', "fields"),
        (',"fields":{"a":1e999}', "fields"),
        (f',"partial":{{"n":{BIG}}}', "partial"),
        (f',"steps":[{{"name":"s","result":{BIG}}}]', "steps"),
        (',"duration_ms":1e999', "duration_ms"),
    ):
        status, body = _results(server, f"big-{mode}", item, extra)
        assert status == 400, (extra, status, body)
        assert body["error"]["details"]["field"] == field, (extra, body)
    # The same claim still ends normally, and (embedded) its attempt is in the wire log.
    status, body = _results(server, f"big-{mode}", item, ',"fields":{"a":9223372036854775807,"f":1.5}')
    assert status == 200 and body["results"][0]["status"] == "ok", body
    if mode == "embedded":
        wirelog = server.data_dir / "wirelog"

        def attempt_logged() -> list[dict[str, Any]]:
            records = [r for r in read_records(wirelog) if r.get("message_id") == item["id"]]
            return records if any(r["kind"] == "log" for r in records) else []

        records = until_sync(attempt_logged, 15, what="the attempt's log record")
        assert [r["kind"] for r in records].count("log") == 1, records
    clean_log(server, since)


# ------------------------------------------------------------------- 3, 10: search hides other tenants
def test_search_of_a_tenant_admin_shows_no_path_and_refuses_a_huge_duration(serve: Server) -> None:
    status, body = serve.json("GET", "/admin/v1/search?group=g1", "a-admin")  # no index was built here
    assert status == 404 and body["error"]["code"] == "no_index", body
    assert str(serve.data_dir) not in json.dumps(body) and "/" not in body["error"]["message"], body
    for since in ("9" * 400 + "d", "9" * 400, "1e999d"):
        status, body = serve.json("GET", f"/admin/v1/search?group=g1&since={since}", "a-admin")
        assert status == 400 and body["error"]["details"]["field"] == "since", (since[-8:], body)


# -------------------------------------------------------------- 4: a client that drops its request body
def _abort(server: Server, head: str) -> None:
    """Send `head` (Content-Length 100) and one byte of body, then close."""
    with server.connect() as sock:
        sock.sendall(head.encode() + b"{")
        time.sleep(0.3)


def _wait_lines(server: Server, since: int, text: str, count: int) -> str:
    until_sync(lambda: server.log()[since:].count(text) >= count, 10, what=f"{count} {text!r} lines")
    time.sleep(0.3)  # anything logged after it
    return server.log()[since:]


def test_an_aborted_body_is_one_warning_line_on_every_face(
    serve: Server, queue_server: ServerProcess
) -> None:
    since = len(serve.log())
    body = "Content-Type: application/json\r\nContent-Length: 100\r\n"
    heads = [
        f"POST /queue/1/o/send HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {secret('a-prod')}\r\n{body}\r\n",
        f"POST /queue/1/o/ack HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {secret('a-work')}\r\n{body}\r\n",
        f"POST /queue/1/o/results HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {secret('a-work')}\r\n{body}\r\n",
        f"POST /queue/1/_sendbatch HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {secret('a-prod')}\r\n{body}\r\n",
        # SQS with a wrong signature: only the access key id is known (the body is read before verify)
        "POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: AmazonSQS.ListQueues\r\nAuthorization: AWS4-HMAC-SHA256 "
        "Credential=a-prod/20261124/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=00\r\n"
        f"{body}\r\n",
        f"PUT /admin/v1/fences/a-work HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {secret('a-admin')}\r\n{body}\r\n",
    ]
    for head in heads:
        _abort(serve, head)
    added = _wait_lines(serve, since, "went away", len(heads))
    clean_log(serve, since)
    lines = [line for line in added.splitlines() if line.strip()]
    assert len([line for line in lines if " WARNING " in line and "went away" in line]) == len(heads), added
    assert len(lines) <= len(heads) + 2, added
    assert serve.json("GET", "/readyz")[0] == 200
    # The queue server's internal API (its internal secret).
    qs = internal(queue_server)
    since = len(qs.log())
    key = "".join(f"{name}: {value}\r\n" for name, value in internal_headers().items())
    _abort(qs, f"POST /v1/queues/iq/send HTTP/1.1\r\nHost: x\r\n{key}{body}\r\n")
    added = _wait_lines(qs, since, "went away", 1)
    clean_log(qs, since)
    assert added.count("went away") == 1 and len(added.strip().splitlines()) <= 2, added


# ---------------------------------------------------------------------------- 9: aiohttp's own errors
MALFORMED_HEADS = [
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nLast-Event-ID: " + b"1" * 9000 + b"\r\n\r\n",
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Strictq-Group: g\x01\r\n\r\n",
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nUser-Agent: x\x7fy\r\n\r\n",
    b"POST /queue/1/q/send HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
]


def _answer(server: Server, data: bytes) -> tuple[int, dict[str, str], bytes]:
    with server.connect() as sock:
        sock.sendall(data)
        raw = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                break
            if not chunk:
                break
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize("data", MALFORMED_HEADS, ids=range(len(MALFORMED_HEADS)))
def test_parser_errors_answer_json(data: bytes, serve: Server, queue_server: ServerProcess) -> None:
    for server in (serve, internal(queue_server)):
        since = len(server.log())
        status, headers, body = _answer(server, data)
        assert status == 400 and headers["content-type"].startswith("application/json"), (
            status,
            headers,
            body,
        )
        error = json.loads(body)["error"]
        assert error["code"] == "bad_request" and error["message"], error
        added = clean_log(server, since)
        assert added.count("WARNING") <= 1, added


# --------------------------------------------------------------------- 8: control characters refused
def test_control_characters_are_refused_on_sqs_and_the_internal_api(
    serve: Server, queue_server: ServerProcess
) -> None:
    since = len(serve.log())
    assert serve.sqs("a-prod", "CreateQueue", {"QueueName": "sq1"})[0] == 200
    base = f"https://{serve.host}:{serve.port}"
    for url in (
        f"{base}/ta/s\nq1",
        f"{base}/ta\n/sq1",
        f"{base}/ta/sq1\n",
        f"{base}/ta/s\tq1",
        f"{base}/ta/sq1\r",
    ):
        answer = serve.sqs("a-prod", "SendMessage", {"QueueUrl": url, "MessageBody": "x"})
        assert sqs_code(answer) == (400, "InvalidParameterValue"), (url, answer)
    assert serve.sqs("a-prod", "SendMessage", {"QueueUrl": f"{base}/ta/sq1", "MessageBody": "x"})[0] == 200
    for tags in ({"k\n": "v"}, {"k": "v\x1b[31m"}, {"k": "\x00"}):
        answer = serve.sqs("a-prod", "CreateQueue", {"QueueName": "sq2", "tags": tags})
        assert sqs_code(answer) == (400, "InvalidParameterValue"), (tags, answer)
        answer = serve.sqs("a-admin", "TagQueue", {"QueueUrl": f"{base}/ta/sq1", "Tags": tags})
        assert sqs_code(answer) == (400, "InvalidParameterValue"), (tags, answer)
    trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5\nParent=x"}}
    answer = serve.sqs(
        "a-prod",
        "SendMessage",
        {"QueueUrl": f"{base}/ta/sq1", "MessageBody": "x", "MessageSystemAttributes": trace},
    )
    assert sqs_code(answer) == (400, "InvalidParameterValue"), answer
    clean_log(serve, since)
    qs = internal(queue_server)
    assert qs.json("PUT", "/v1/queues/iq", body={"attributes": {}})[0] == 200
    for labels in ({"k": "\x00"}, {"k\n": "v"}, {"k": "a\x1b[2J"}):
        status, body = qs.json("PATCH", "/v1/queues/iq", body={"attributes": {"labels": labels}})
        assert status == 400 and body["error"]["details"]["field"] == "labels", (labels, body)
    policy = '{\n\t"Version": "2012-10-17"\r\n}'  # JSON text may span lines
    status, body = qs.json("PATCH", "/v1/queues/iq", body={"attributes": {"labels": {"sqs:Policy": policy}}})
    assert status == 200 and body["attributes"]["labels"]["sqs:Policy"] == policy, body


# ------------------------------------------------------------------------- 10: move references as URLs
def test_a_move_reference_of_dots_is_an_unknown_move_through_a_queue_server(remote: Server) -> None:
    since = len(remote.log())
    unknown = remote.json("GET", "/queue/1/_move/no-such-move", "a-admin")
    assert unknown[0] == 404, unknown
    for reference in ("..", "%2E%2E", ".", "%2E"):
        status, body = remote.json("GET", f"/queue/1/_move/{reference}", "a-admin")
        assert (status, body["error"]["code"]) == (404, unknown[1]["error"]["code"]), (reference, body)
    clean_log(remote, since)


# -------------------------------------------------------------------------------- 5: start-up faults
def _used_data_dir(tmp_path: Path) -> Path:
    """A data dir of `strictq serve` that ran once (store, marker, keys, wire log, receipt key)."""
    server = _start_serve(tmp_path)
    try:
        assert server.json("POST", "/queue/1/orders/send", "a-prod", {"n": 1})[0] == 200
    finally:
        _stop(server.process)
    assert (server.data_dir / ".strictq-store").exists() and (server.data_dir / "receipt.key").exists()
    return server.data_dir


def _argv(data: Path, *extra: str) -> list[str]:
    return serve_argv(data, "--keys", str(data.parent / "keys.toml"), "--no-proxy", *extra)


def test_a_wire_log_path_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    data = _used_data_dir(tmp_path)
    wirelog = data / "wirelog"
    for child in wirelog.iterdir():
        child.unlink()
    wirelog.rmdir()
    wirelog.write_text("x")
    assert_one_line_fault(run_fault(_argv(data)), wirelog, "not a directory")


def test_a_client_env_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    data = _used_data_dir(tmp_path)
    (data / "client.env").unlink()
    (data / "client.env").mkdir()
    assert_one_line_fault(run_fault(_argv(data)), data / "client.env", "is a directory", "move it aside")


def test_a_read_only_wire_log_directory_is_one_line(tmp_path: Path) -> None:
    data = _used_data_dir(tmp_path)
    wirelog = data / "wirelog"
    wirelog.chmod(0o500)
    try:
        result = run_fault(_argv(data), _drop_root())
    finally:
        wirelog.chmod(0o750)
    assert_one_line_fault(result, wirelog, "cannot write")


def test_a_bad_receipt_key_is_the_only_line(tmp_path: Path) -> None:
    data = _used_data_dir(tmp_path)
    key = data / "receipt.key"
    key.write_text("zz\n")
    assert_one_line_fault(run_fault(_argv(data)), key, "not an SQS receipt key")  # alone: no INFO first
    assert key.read_text() == "zz\n"


def test_an_empty_sqlite_store_is_refused_without_init(tmp_path: Path) -> None:
    data = _used_data_dir(tmp_path)
    store = data / "queue" / "queue.sqlite3"
    for leftover in ("queue.sqlite3-wal", "queue.sqlite3-shm"):
        (data / "queue" / leftover).unlink(missing_ok=True)
    store.unlink()
    db = sqlite3.connect(store)
    db.execute("VACUUM")  # a valid SQLite file without a table
    db.close()
    assert store.stat().st_size > 0
    line = assert_one_line_fault(run_fault(_argv(data)), store, "without a strictq store", "--init")
    assert ".strictq-store" in line
    server = _start_serve(data.parent, "--init")
    _stop(server.process)
    assert "--init: starting with an empty store" in server.log()
    assert [p for p in (data / "queue").iterdir() if p.name.startswith("queue.sqlite3.before-init-")]


def test_a_queue_server_store_without_the_schema_is_refused(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    store = make_store(data, messages=3)
    (data / ".strictq-store").write_text("queue.sqlite3\n")
    for leftover in ("queue.sqlite3-wal", "queue.sqlite3-shm"):
        (data / leftover).unlink(missing_ok=True)
    store.unlink()
    db = sqlite3.connect(store)
    db.execute("CREATE TABLE other (x)")  # someone else's database
    db.commit()
    db.close()
    argv = [sys.executable, "-m", "strictq", "queue-server", "--host", "127.0.0.1", "--port", "0"]
    assert_one_line_fault(run_fault([*argv, "--data-dir", str(data)]), store, "without a strictq store")


# ---------------------------------------------------------------------- 10: the proxy CA's public files
def test_the_proxy_ca_public_files_are_0644_under_umask_0(tmp_path: Path) -> None:
    from fencing.ca import ensure_ca

    old = os.umask(0)
    try:
        ensure_ca(tmp_path / "proxy")
    finally:
        os.umask(old)
    ca = tmp_path / "proxy" / "ca"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in ca.iterdir()}
    assert modes["mitmproxy-ca.pem"] == 0o600 and modes["mitmproxy-ca.p12"] == 0o600, modes
    for name in (
        "mitmproxy-ca-cert.pem",
        "mitmproxy-ca-cert.cer",
        "mitmproxy-ca-cert.p12",
        "mitmproxy-dhparam.pem",
    ):
        assert modes[name] == 0o644, (name, oct(modes[name]))


# ------------------------------------------------------------ 3: search statistics of other tenants
async def test_search_lookup_statistics_do_not_tell_of_another_tenant(spark: Any, tmp_path: Path) -> None:
    """B's admin gets the same answer for A's group or message id as for ones that exist nowhere: the
    lookup counts (files, row groups, rows read before the tenant filter) are the operator's only."""
    import asyncio

    from test_security_tenancy import poll, send, tenancy_gateway

    from gateway.deliveries import DeliveryLog
    from spark.index import run_index

    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    deliveries = DeliveryLog(wirelog, key_dir=tmp_path, compress=False)
    deliveries.start()
    async with tenancy_gateway(tmp_path, deliveries=deliveries, index=index) as gw:
        await send(gw, "a", "a-only-group", {"text": "A's"})
        (a_item,) = await poll(gw, "a")
        await deliveries.close()
        await asyncio.to_thread(run_index, spark, wirelog, index)

        async def search(key_id: str, **params: str) -> dict[str, Any]:
            status, body = await gw.call("GET", "/admin/v1/search", key_id, params=params)
            assert status == 200, body
            return dict(body)

        for present, absent in (
            ({"group": "a-only-group"}, {"group": "no-such-group"}),
            ({"message_id": a_item["id"]}, {"message_id": "no-such-message"}),
        ):
            seen, unseen = await search("b-admin", **present), await search("b-admin", **absent)
            assert "lookup" not in seen and seen["records"] == [], seen
            del seen["query"], unseen["query"]
            assert seen == unseen
        operator = await search("ops-1", message_id=a_item["id"])
        assert operator["lookup"]["rows_read"] >= 1 and len(operator["records"]) == 1, operator
        own = await search("a-admin", message_id=a_item["id"])
        assert "lookup" not in own and len(own["records"]) == 1, own
