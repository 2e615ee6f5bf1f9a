"""Redaction: nothing secret reaches disk; tokens are stable; endpoint levels; config and key file."""

from __future__ import annotations

import base64
import gzip
import re
import stat
from pathlib import Path

import orjson
import pytest

from wirelog.errors import ConfigError
from wirelog.reader import read_records, segments
from wirelog.record import delivery_record, header_block, http_record
from wirelog.redaction import (
    EndpointRule,
    Level,
    RedactionConfig,
    Redactor,
    load_or_create_key,
    split_host_path,
)
from wirelog.writer import WireLogWriter

KEY = bytes(range(32))
TOKEN = re.compile(r"redacted:[0-9a-f]{16}")

SECRETS = {
    "bearer": "eyJhbGciOiJIUzI1NiJ9.bearer-secret-1",
    "proxy": "d29ya2VyLTE6cHJveHktc2VjcmV0",
    "cookie": "session-cookie-secret-2",
    "set_cookie": "set-cookie-secret-3",
    "api_key": "api-key-secret-4",
    "json_password": "hunter2-json-secret-5",
    "json_nested": "nested-token-secret-6",
    "json_in_list": "list-secret-7",
    "query": "query-token-secret-8",
    "form": "form-password-secret-9",
    "userinfo": "userinfo-secret-10",
    "response_token": "response-access-token-11",
    "attribute": "attribute-api-key-12",
    "big_int_json": "bigint-doc-secret-13",
    "broken_json": "broken-json-secret-14",
    "pin": "4711",
}


def redactor(config: RedactionConfig | None = None, key: bytes = KEY) -> Redactor:
    return Redactor(config or RedactionConfig(), key)


def test_nothing_secret_reaches_disk(tmp_path: Path) -> None:
    """Records written through Redactor + Writer; every segment decompressed and searched raw."""
    r = redactor()
    s = SECRETS
    request_body = orjson.dumps(
        {
            "user": "alice",
            "password": s["json_password"],
            "profile": {"settings": {"Access_Token": s["json_nested"]}},
            "items": [{"ok": 1}, {"api_key": s["json_in_list"]}],
            "pin": 1234,
        }
    )
    records = []
    for level in (Level.FULL, Level.HEADERS_OMITTED, Level.METADATA, Level.ON_FAILURE):
        request, response = r.exchange(
            method="POST",
            url=f"https://alice:{s['userinfo']}@api.example:8443/v1/pay?token={s['query']}&page=2#frag",
            request_headers=[
                (b"Authorization", f"Bearer {s['bearer']}".encode()),
                ("Proxy-Authorization", f"Basic {s['proxy']}"),
                ("Cookie", f"theme=dark; session={s['cookie']}"),
                ("X-Api-Key", s["api_key"]),
                ("Content-Type", "application/json; charset=utf-8"),
                ("X-Strictq-Lease", "12884901889"),
            ],
            request_body=request_body,
            status=503,
            response_headers=[
                ("Set-Cookie", f"sid={s['set_cookie']}; Path=/; HttpOnly"),
                ("Content-Type", "application/vnd.api+json"),
            ],
            response_body=orjson.dumps({"data": {"access_token": s["response_token"]}}),
            level=level,
        )
        records.append(http_record(request=request, response=response, message_id="m1", latency_ms=2.0))
    form_request, _ = r.exchange(
        method="POST",
        url="http://login.example/form",
        request_headers=[("Content-Type", "application/x-www-form-urlencoded")],
        request_body=f"user=bob&password={s['form']}&x=1".encode(),
    )
    records.append(http_record(request=form_request, response=None, error="connection refused"))
    big, _ = r.exchange(
        method="PUT",
        url="http://a.example/doc",
        request_headers=[("content-type", "application/json")],
        request_body=b'{"id": 123456789012345678901234567890, "secret": "'
        + s["big_int_json"].encode()
        + b'"}',
    )
    broken, _ = r.exchange(
        method="PUT",
        url="http://a.example/doc",
        request_headers=[("content-type", "application/json")],
        request_body=b'{"a": 1, "password": "' + s["broken_json"].encode() + b'", "b": [',
    )
    records += [http_record(request=big, response=None), http_record(request=broken, response=None)]
    pin_body = r.body("application/json", b'{"password": 4711}')
    records.append(
        http_record(request={"method": "GET", "url": "x", "body": pin_body.decode()}, response=None)
    )
    records.append(
        delivery_record(
            queue="orders",
            message_id="m1",
            group="g1",
            body=r.body("application/json", orjson.dumps({"token": s["json_nested"], "n": 1})),
            attributes=r.value({"headers": {"X-Api-Key": "ignored", "api_key": s["attribute"]}}),
        )
    )
    with WireLogWriter(tmp_path, "proxy", max_segment_bytes=2048) as writer:
        for record in records:
            writer.write(record)

    raw = b"".join(
        gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        for p in segments(tmp_path)
    )
    assert raw.count(b"\n") == len(records) and len(segments(tmp_path)) > 1
    for name, secret in SECRETS.items():
        for form in (secret.encode(), base64.b64encode(secret.encode())):
            # Delimited: a short secret (the 4-digit pin) may occur by chance inside a timestamp, a record
            # id or a redaction digest, and that is not a leak.
            leak = re.compile(rb"(?<![0-9A-Za-z])" + re.escape(form) + rb"(?![0-9A-Za-z])")
            assert not leak.search(raw), f"{name} leaked"
    assert b"alice" in raw and b"12884901889" in raw and b"page=2" in raw  # non-secrets kept
    assert b"Bearer redacted:" in raw and b"theme=redacted:" in raw and b"; Path=/; HttpOnly" in raw
    assert len(list(read_records(tmp_path))) == len(records)


def test_equal_secrets_give_equal_tokens_under_one_key() -> None:
    r = redactor()
    a = r.headers([("Authorization", "Bearer same-secret")])[0][1]
    b = r.headers([(b"authorization", b"Bearer same-secret")])[0][1]
    c = r.headers([("Authorization", "Bearer other-secret")])[0][1]
    assert a == b != c
    assert TOKEN.fullmatch(a.split(" ", 1)[1])
    # the same secret in a query parameter, a JSON field and a header: one token
    in_url = r.url("https://x.example/?api_key=same-secret")
    in_json = orjson.loads(r.body("application/json", b'{"api_key": "same-secret"}'))["api_key"]
    assert in_url.endswith(in_json) and in_json == a.split(" ", 1)[1]
    assert redactor(key=bytes(32)).token("same-secret") != r.token("same-secret")  # key-dependent


def test_headers_keep_names_order_and_non_secrets() -> None:
    r = redactor()
    out = r.headers(
        [("Host", "api.example"), ("X-Api-Key", "k"), ("X-Strictq-Lease", "42"), ("Accept", "*/*")]
    )
    assert [name for name, _ in out] == ["Host", "X-Api-Key", "X-Strictq-Lease", "Accept"]
    assert out[0][1] == "api.example" and out[2][1] == "42" and TOKEN.fullmatch(out[1][1])
    custom = redactor(RedactionConfig.from_dict({"secret_headers": ["X-Internal"]}))
    assert TOKEN.fullmatch(custom.headers([("x-internal", "v")])[0][1])


def test_url_redaction_is_targeted() -> None:
    r = redactor()
    assert r.url("https://api.example/v1/x?page=2&q=a+b") == "https://api.example/v1/x?page=2&q=a+b"
    out = r.url("https://u:p@api.example/x?Token=abc&sig=&page=1#token=frag")
    assert out.startswith("https://redacted:") and "@api.example/x?Token=redacted:" in out
    assert out.endswith("&sig=&page=1#token=frag")  # empty values and fragments untouched
    assert "abc" not in out and ":p@" not in out
    assert r.url("/relative?password=x&a=1").startswith("/relative?password=redacted:")
    assert r.url(out) == out  # idempotent: tokens are not re-tokenized


def test_json_body_rewritten_only_when_needed() -> None:
    r = redactor()
    untouched = b'{ "user": "alice",  "n": [1, 2] }'
    assert r.body("application/json", untouched) is untouched  # formatting (and hash) preserved
    assert r.body("text/html", b'{"password": "x"}') == b'{"password": "x"}'  # not JSON by type
    assert r.body("application/octet-stream", b"\x00password") == b"\x00password"
    escaped = r.body("application/json", b'{"p\\u0061ssword": "x"}')  # a name spelled with escapes
    assert b'"x"' not in escaped and b"redacted:" in escaped
    sniffed = r.body(None, b' {"token": "abc"}')  # no content type, looks like JSON
    assert b"abc" not in sniffed
    nested = orjson.loads(r.body("application/problem+json", b'{"a": {"b": [{"SECRET": {"deep": 1}}]}}'))
    assert TOKEN.fullmatch(nested["a"]["b"][0]["SECRET"])
    assert r.body("application/json", b"") == b""


def test_form_bodies() -> None:
    r = redactor()
    out = r.body("application/x-www-form-urlencoded; charset=utf-8", b"user=bob&password=p%40ss&api_key=k")
    text = out.decode()
    assert text.startswith("user=bob&password=redacted:") and "p%40ss" not in text
    assert r.token("p@ss") in text  # decoded before tokenizing: same token as the raw secret


def test_headers_omitted_keeps_bytes_and_sha256_of_the_redacted_block() -> None:
    r = redactor()
    headers = [("Authorization", "Bearer s3cret"), ("Accept", "application/json")]
    request, response = r.exchange(
        method="GET",
        url="https://api.example/x",
        request_headers=headers,
        request_body=b"hello",
        status=200,
        response_headers=[("Content-Type", "text/plain")],
        response_body=b"world",
        level=Level.HEADERS_OMITTED,
    )
    assert request["headers"] is None and request["body"] == "hello"
    assert request["headers_omitted"] == header_block(r.headers(headers))
    assert request["headers_omitted"]["bytes"] == len(f"Authorization: Bearer {r.token('s3cret')}\r\n") + len(
        "Accept: application/json\r\n"
    )
    assert response is not None and response["headers"] is None and response["body"] == "world"
    again, _ = r.exchange(
        method="GET",
        url="https://api.example/x",
        request_headers=headers,
        request_body=b"",
        level=Level.METADATA,
    )
    assert again["headers_omitted"] == request["headers_omitted"]  # the same request still matches


def test_metadata_level_keeps_only_hashes_and_sizes() -> None:
    r = redactor()
    request, response = r.exchange(
        method="POST",
        url="https://api.example/x?token=t",
        request_headers=[("Content-Type", "application/json")],
        request_body=b'{"password": "p", "n": 1}',
        status=201,
        response_headers=[("Content-Type", "text/plain")],
        response_body=b"created",
        level=Level.METADATA,
    )
    full, _ = r.exchange(
        method="POST",
        url="https://api.example/x?token=t",
        request_headers=[("Content-Type", "application/json")],
        request_body=b'{"password": "p", "n": 1}',
        level=Level.FULL,
    )
    assert request["url"] == full["url"] and "token=redacted:" in request["url"]
    assert request["headers"] is None and request["headers_omitted"]["bytes"] > 0
    assert request["body"] is None and request["body_b64"] is None
    assert request["body_sha256"] == full["body_sha256"] and request["body_bytes"] == full["body_bytes"]
    assert response is not None and response["status"] == 201 and response["body"] is None
    assert response["body_bytes"] == len(b"created") and response["body_sha256"]


@pytest.mark.parametrize(
    "status,error,expected",
    [
        (200, None, Level.METADATA),
        (404, None, Level.METADATA),
        (503, None, Level.FULL),
        (None, "refused", Level.FULL),
    ],
)
def test_on_failure_level(status: int | None, error: str | None, expected: Level) -> None:
    r = redactor(RedactionConfig(default_level=Level.ON_FAILURE))
    assert Redactor.effective(Level.ON_FAILURE, status=status, error=error) is expected
    request, response = r.exchange(
        method="GET",
        url="https://api.example/x",
        request_headers=[("Accept", "*/*")],
        request_body=b"q",
        status=status,
        response_headers=[],
        response_body=b"r",
        error=error,
    )
    assert (request["headers"] is not None) is (expected is Level.FULL)
    assert (request["body"] is not None) is (expected is Level.FULL)
    assert (response is None) is (status is None)


def test_level_for_endpoint_rules_first_match_wins() -> None:
    config = RedactionConfig(
        endpoints=(
            EndpointRule("payments.example", "/v1/charges/*/refunds", Level.FULL),
            EndpointRule("payments.example", "/v1/charges", Level.METADATA),
            EndpointRule("*.internal", "/", Level.HEADERS_OMITTED),
            EndpointRule("api.example:8443", "/", Level.ON_FAILURE),
        ),
        default_level=Level.FULL,
    )
    r = redactor(config)
    assert r.level_for("payments.example", "/v1/charges/ch_1/refunds") is Level.FULL
    assert r.level_for("PAYMENTS.example", "/v1/charges/ch_1") is Level.METADATA
    assert r.level_for("payments.example:443", "/v1/charges?x=1") is Level.METADATA  # port, query ignored
    assert r.level_for("db.internal", "/anything") is Level.HEADERS_OMITTED
    assert r.level_for("api.example:8443", "/x") is Level.ON_FAILURE
    assert r.level_for("api.example", "/x") is Level.FULL  # the rule names a port
    assert r.level_for("other.example", "/v1/charges") is Level.FULL
    assert split_host_path("https://u:p@api.example:8443/a/b?c=d#e") == ("api.example:8443", "/a/b")
    assert split_host_path("http://h") == ("h", "/")


def test_exchange_looks_up_the_level_from_the_url() -> None:
    r = redactor(RedactionConfig(endpoints=(EndpointRule("quiet.example", "/", Level.METADATA),)))
    request, _ = r.exchange(
        method="GET", url="https://quiet.example/x", request_headers=[], request_body=b"b"
    )
    assert request["body"] is None and request["body_bytes"] == 1


# ------------------------------------------------------------------------------------------- config
def test_config_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "redaction.toml"
    path.write_text(
        """
        secret_headers = ["X-Internal-Token"]
        json_fields = ["ssn"]
        query_params = ["session"]
        default_level = "headers-omitted"
        max_body_bytes = 0

        [[endpoints]]
        host = "*.payments.example"
        path = "/v1/charges"
        level = "metadata"

        [[endpoints]]
        host = "search.example"
        level = "on-failure"
        """
    )
    config = RedactionConfig.load(path)
    assert "x-internal-token" in config.secret_headers and "authorization" in config.secret_headers
    assert "ssn" in config.json_fields and "password" in config.json_fields
    assert "session" in config.query_params
    assert config.default_level is Level.HEADERS_OMITTED and config.max_body_bytes is None
    assert [(e.host, e.path, e.level) for e in config.endpoints] == [
        ("*.payments.example", "/v1/charges", Level.METADATA),
        ("search.example", "/", Level.ON_FAILURE),
    ]
    nested = tmp_path / "proxy.toml"
    nested.write_text('[redaction]\ndefaults = false\njson_fields = ["only"]\n')
    only = RedactionConfig.load(nested)
    assert only.json_fields == frozenset({"only"}) and only.secret_headers == frozenset()
    assert RedactionConfig.default() == RedactionConfig()


@pytest.mark.parametrize(
    "text,message",
    [
        ('jsonfields = ["x"]', "unknown key"),
        ('default_level = "verbose"', "level"),
        ('[[endpoints]]\nhost = "x"', "level required"),
        ('[[endpoints]]\nhost = "x"\nlevel = "full"\nmethod = "GET"', "endpoints #1"),
        ("json_fields = [1]", "list of non-empty strings"),
        ("max_body_bytes = -1", "max_body_bytes"),
        ("defaults = 1", "defaults"),
        ("not toml = = =", "TOML"),
    ],
)
def test_config_errors_are_clear(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        RedactionConfig.load(path)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        RedactionConfig.load(Path("/nonexistent/redaction.toml"))


def test_key_file_created_private_and_stable(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    key = load_or_create_key(data_dir)
    path = data_dir / "redaction.key"
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(data_dir) == key
    assert [p.name for p in data_dir.iterdir()] == ["redaction.key"]  # no temporary files left
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match="32 bytes"):
        load_or_create_key(data_dir)
    with pytest.raises(ConfigError):
        Redactor(RedactionConfig(), b"tiny")


PRECHECK_BODIES = [
    b'"just a string body"',
    b'{"n": 1, "payload": "x"}',
    b'{"name": "a", "amount": 3}',
    b'{"card": {"number": "4111111111111111"}}',
    b'{"session": {"id": "abc"}}',
    b'{"SessionId": "abc"}',
    b'{"X-Api-Key" : "k"}',
    b'{"db_password":"p"}',
    b'{"cvv2": 123}',
    b'{"pan": "4111"}',
    b'{"items": [{"token": "t"}, {"ok": 1}]}',
    b'{"client-secret": "s", "other": {"deep": {"refresh_token": "r"}}}',
    b'{"key": {"": "empty name under a parent"}}',
    b'{"apikey_": "trailing separator"}',
    b'{"tok\\u0065n": "escaped name"}',
    b'{"broken": "json", "password": "p"',
    b'{"password": ',
    b'[1, 2, {"privateKey": "pk"}]',
    '{"pässword": "non-ascii neighbour", "token": "t"}'.encode(),
    b'{"description": "a value that says \\"token\\": here"}',
]


@pytest.mark.parametrize("config", [RedactionConfig(), RedactionConfig(secret_suffixes=frozenset())])
@pytest.mark.parametrize("content_type", ["application/json", None, "text/plain"])
def test_key_precheck_changes_no_answer(config: RedactionConfig, content_type: str | None) -> None:
    """The raw-bytes pre-check (a body no key of which can be secret is not parsed) answers as the parse:
    with it turned into a match-everything pattern, every body redacts to the same bytes."""
    fast = redactor(config)
    slow = redactor(config)
    slow._maybe_secret_key = re.compile(b"")  # every body "may" hold a secret key: the full path
    redacted = 0
    for body in PRECHECK_BODIES:
        assert fast.body(content_type, body) == slow.body(content_type, body), body
        redacted += fast.body(content_type, body) != body
    assert redacted >= 10  # the corpus does hold secrets the check must not skip


def test_key_precheck_skips_bodies_without_candidate_keys() -> None:
    """What makes it pay: a body whose keys cannot be secret is returned as the very same object."""
    r = redactor()
    for body in (b'"plain"', b'{"x": 1, "message": "xyz"}', b'{"name": "a", "value": [1, 2]}'):
        assert r.body("application/json", body) is body
        assert r._maybe_secret_key.search(body) is None
