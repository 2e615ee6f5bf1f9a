"""Redaction defaults (issue 11, item 9): payment and token fields and headers never reach the wire log raw.

Each listed name, in any case and with `-` or `_`, is redacted in a proxy record (`Redactor.exchange`, as the
proxy's redact addon calls it: JSON body, url-encoded form, multipart form, query string, header) and in a
delivery record written by the real gateway (`gateway.deliveries`, JSON bodies; the delivery log's redactor
is the default one, so form and multipart bodies too).
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import aiohttp
import orjson
import pytest
from gateway_support import Gateway, delivery_gateway  # noqa: F401 (fixture)

from wirelog.reader import read_records
from wirelog.record import http_record
from wirelog.redaction import RedactionConfig, Redactor

FIELDS = [
    "card_number",
    "cardNumber",
    "pan",
    "cc_number",
    "cvv",
    "cvc",
    "cvv2",
    "api-key",
    "api_key",
    "apikey",
    "auth_token",
    "access_token",
    "refresh_token",
    "id_token",
    "client_secret",
    "secret",
    "private_key",
    "session",
    "sessionid",
    "session_id",
    "password",
    # by suffix (issue 11 review, finding 7): any name whose letters and digits end with a secret suffix
    "creditCardNumber",
    "card[number]",
    "card[cvc]",
    "x_api_token",
    "db_password",
    "googleApiKey",
    "JSESSIONID",
    "aws_secret_access_key",
]
HEADERS = [
    "Api-Key",
    "X-Api-Key",
    "X-Auth-Token",
    "x_auth_token",
    "Authorization",
    "Proxy-Authorization",
    "X-Session-Id",
    "Set-Cookie",
    "Cookie",
    "X-Amz-Security-Token",
    "X-Api-Token",
    "Private-Token",
    "X-Goog-Api-Key",
    "Ocp-Apim-Subscription-Key",
    "X-Session-Token",
    "X-Shopify-Access-Token",
]


def _secret() -> str:
    return "s3cr3t-" + secrets.token_hex(8)


def _redactor() -> Redactor:
    return Redactor(RedactionConfig.default(), secrets.token_bytes(32))


def _multipart(name: str, value: str, boundary: str = "b0undary") -> bytes:
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        f"--{boundary}--\r\n"
    ).encode()


@pytest.mark.parametrize("name", FIELDS)
def test_fields_are_redacted_in_proxy_records(name: str) -> None:
    r = _redactor()
    shapes: list[tuple[str, list[tuple[str, str]], bytes, str]] = []
    for variant in (name, name.upper(), name.replace("_", "-")):
        value = _secret()
        shapes += [
            (
                "json",
                [("Content-Type", "application/json")],
                json.dumps({"a": {variant: value}}).encode(),
                value,
            ),
            (
                "form",
                [("Content-Type", "application/x-www-form-urlencoded")],
                f"x=1&{variant}={value}".encode(),
                value,
            ),
            (
                "multipart",
                [("Content-Type", "multipart/form-data; boundary=b0undary")],
                _multipart(variant, value),
                value,
            ),
        ]
    for shape, headers, body, value in shapes:
        request, _ = r.exchange(
            method="POST", url="https://pay.example/v1/charge", request_headers=headers, request_body=body
        )
        text = orjson.dumps(http_record(request=request, response=None, error="x")).decode()
        assert value not in text, (shape, text)
        assert "redacted:" in text, shape
    value = _secret()
    request, _ = r.exchange(
        method="GET",
        url=f"https://pay.example/v1/x?page=2&{name}={value}",
        request_headers=[],
        request_body=None,
    )
    assert value not in orjson.dumps(request).decode() and "page=2" in request["url"]


@pytest.mark.parametrize("name", HEADERS)
def test_headers_are_redacted_in_proxy_records(name: str) -> None:
    r = _redactor()
    value = _secret()
    request, response = r.exchange(
        method="GET",
        url="https://api.example/",
        request_headers=[(name, value), ("Accept", "text/plain")],
        request_body=None,
        status=200,
        response_headers=[(name, value)],
        response_body=b"",
    )
    text = orjson.dumps(http_record(request=request, response=response)).decode()
    assert value not in text and "text/plain" in text


def test_the_delivery_log_uses_the_defaults_for_every_body_shape(tmp_path: Any) -> None:
    from gateway.deliveries import DeliveryLog

    log = DeliveryLog(tmp_path / "wirelog", key_dir=tmp_path, compress=False)
    value = _secret()
    for content_type, body in (
        ("application/x-www-form-urlencoded", f"cvv={value}".encode()),
        ("multipart/form-data; boundary=b0undary", _multipart("X-Auth-Token", value)),
        ("application/json", json.dumps({"cardNumber": value}).encode()),
    ):
        assert value.encode() not in log.redactor.body(content_type, body)


async def test_fields_are_redacted_in_delivery_records(delivery_gateway: Gateway) -> None:  # noqa: F811
    import ssl

    gw = delivery_gateway
    assert gw.deliveries is not None
    context = ssl.create_default_context(cafile=str(gw.ca_file))
    values = {name: _secret() for name in FIELDS}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        producer = {"X-BV-API-Key": gw.credential("producer-1").secret}
        worker = {"X-BV-API-Key": gw.credential("worker-1").secret}
        url = f"{gw.url}/queue/1/pay"
        async with session.post(
            f"{url}/send", json={"order": {"payment": values}}, headers=producer
        ) as answer:
            assert answer.status == 200, await answer.text()
        async with session.get(f"{url}/poll?limit=1&ttl=30", headers=worker) as answer:
            assert answer.status == 200 and len(await answer.json()) == 1
    gw.deliveries.flush()
    deliveries = [r for r in read_records(gw.deliveries.directory) if r["kind"] == "delivery"]
    assert len(deliveries) == 1 and deliveries[0]["body_redacted"] is True
    text = orjson.dumps(deliveries[0]).decode()
    assert not [name for name, value in values.items() if value in text]


# ------------------------------------------------------ shapes the review found raw (issue 11 review, 7)
def _record_text(r: Redactor, content_type: str, body: bytes, url: str = "https://pay.example/v1/x") -> str:
    request, _ = r.exchange(
        method="POST", url=url, request_headers=[("Content-Type", content_type)], request_body=body
    )
    return orjson.dumps(http_record(request=request, response=None, error="x")).decode()


def test_nested_card_objects_and_bracketed_form_names_are_card_fields() -> None:
    r = _redactor()
    number, cvc = "4242424242424242", "cvc-zq731qz"  # no hex or token could contain it
    stripe = {"amount": 5, "source": {"card": {"number": number, "cvc": cvc, "exp_month": 12}}}
    text = _record_text(r, "application/json", json.dumps(stripe).encode())
    assert number not in text and cvc not in text and "exp_month" in text, text
    form = f"amount=5&card[number]={number}&card%5Bcvc%5D={cvc}&card[exp_month]=12".encode()
    query = f"https://pay.example/x?card[number]={number}"
    text = _record_text(r, "application/x-www-form-urlencoded", form, query)
    assert number not in text and cvc not in text and "card[exp_month]=12" in text, text
    # Not every `number` is a card's.
    text = _record_text(r, "application/json", json.dumps({"phone": {"number": "5550100"}}).encode())
    assert "5550100" in text


def test_json_in_a_multipart_file_part_is_redacted() -> None:
    r = _redactor()
    value = _secret()
    body = (
        '--b0undary\r\nContent-Disposition: form-data; name="upload"; filename="x.json"\r\n'
        "Content-Type: application/json\r\n\r\n"
        f'{{"api_key": "{value}", "cvv": "{value}", "keep": "visible"}}\r\n'
        '--b0undary\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n--b0undary--\r\n'
    ).encode()
    text = _record_text(r, "multipart/form-data; boundary=b0undary", body)
    assert value not in text and "visible" in text and "hello" in text, text


@pytest.mark.parametrize("charset", ["utf-16", "utf-16-le", "utf-32", None])
def test_json_in_another_charset_is_redacted_not_kept_whole(charset: str | None) -> None:
    r = _redactor()
    value = _secret()
    document = {"card_number": value, "keep": "visible"}
    encoded = json.dumps(document).encode(charset or "utf-16")  # None: no charset given, a BOM says it
    content_type = "application/json" + (f"; charset={charset}" if charset else "")
    request, _ = r.exchange(
        method="POST",
        url="https://pay.example/v1/charges",
        request_headers=[("Content-Type", content_type)],
        request_body=encoded,
    )
    kept = base64.b64decode(request["body_b64"]) if request.get("body_b64") else request["body"].encode()
    decoded = kept.decode(charset or "utf-16")
    assert value not in decoded and "redacted:" in decoded and "visible" in decoded, decoded
    withheld = r.body("application/json; charset=x-no-such-charset", json.dumps(document).encode())
    assert value.encode() not in withheld


async def test_a_nested_card_payload_is_redacted_in_the_delivery_record(delivery_gateway: Gateway) -> None:  # noqa: F811
    import ssl

    gw = delivery_gateway
    assert gw.deliveries is not None
    number = "4000056655665556"
    context = ssl.create_default_context(cafile=str(gw.ca_file))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        url = f"{gw.url}/queue/1/cards"
        payload = {"charge": {"card": {"number": number, "cvc": "123"}, "creditCardNumber": number}}
        headers = {"X-BV-API-Key": gw.credential("producer-1").secret}
        async with session.post(f"{url}/send", json=payload, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
        headers = {"X-BV-API-Key": gw.credential("worker-1").secret}
        async with session.get(f"{url}/poll?limit=1&ttl=30", headers=headers) as answer:
            assert answer.status == 200 and len(await answer.json()) == 1
    gw.deliveries.flush()
    deliveries = [r for r in read_records(gw.deliveries.directory) if r["kind"] == "delivery"]
    assert len(deliveries) == 1
    assert number not in orjson.dumps(deliveries[0]).decode()


def test_secret_suffixes_are_configurable() -> None:
    key = secrets.token_bytes(32)
    body = json.dumps({"customer_ssn": "078-05-1120", "next_token": "t-1"}).encode()
    extended = Redactor(RedactionConfig.from_dict({"secret_suffixes": ["SSN"]}), key)
    assert b"078-05-1120" not in extended.body("application/json", body)
    bare = Redactor(RedactionConfig.from_dict({"defaults": False}), key)
    assert bare.body("application/json", body) == body  # no suffixes, no names: nothing redacted
    assert bare.headers([("X-Api-Token", "v")]) == [["X-Api-Token", "v"]]
