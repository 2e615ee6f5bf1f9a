"""Redaction defaults (issue 11, item 9): payment and token fields and headers never reach the wire log raw.

Each listed name, in any case and with `-` or `_`, is redacted in a proxy record (`Redactor.exchange`, as the
proxy's redact addon calls it: JSON body, url-encoded form, multipart form, query string, header) and in a
delivery record written by the real gateway (`gateway.deliveries`, JSON bodies; the delivery log's redactor
is the default one, so form and multipart bodies too).
"""

from __future__ import annotations

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
