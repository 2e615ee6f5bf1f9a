"""The redact addon: nothing secret reaches the wire log (checked on the raw, decompressed bytes of every
file the proxy wrote), secrets become stable tokens, endpoint levels cut records down, and the real
request that goes upstream is never modified by redaction."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from mitmproxy.test import taddons, tflow
from proxy_support import (
    Backends,
    WorkerClient,
    credential,
    http_records,
    make_tags,
    segment_bytes,
    unique,
    wait_marked,
    with_marker,
)

from fencing.addons.redact import Redact, _identity
from fencing.context import context_of, ensure_context
from fencing.mimic import identity_from_url
from fencing.runtime import ProxyRuntime

CONFIG = """
[redaction]
secret_headers = ["x-secret-header"]
json_fields = ["card_number"]
query_params = ["session"]

[[redaction.endpoints]]
path = "/meta"
level = "metadata"

[[redaction.endpoints]]
path = "/ho"
level = "headers-omitted"

[[redaction.endpoints]]
path = "/of"
level = "on-failure"
"""

pytest_plugins = ["proxy_support"]  # its fixtures: backends, proxies, CAs


@pytest.fixture
def redaction_config(tmp_path: Path) -> Path:
    path = tmp_path / "redaction.toml"
    path.write_text(CONFIG)
    return path


# ------------------------------------------------------------------------------------------- unit
async def test_views_never_touch_the_real_request(tmp_path: Path, redaction_config: Path) -> None:
    redact = Redact(ProxyRuntime())
    with taddons.context(redact) as tctx:
        tctx.configure(
            redact, strictq_redaction=str(redaction_config), strictq_redaction_key_dir=str(tmp_path)
        )
        flow = tflow.tflow()
        flow.request.path = "/api?session=S3CR3T&x=1"
        flow.request.headers["Authorization"] = "Bearer T0KEN"
        flow.request.headers["Content-Type"] = "application/json"
        flow.request.content = b'{"card_number": "4111", "n": 1}'
        before = (flow.request.path, flow.request.headers.fields, flow.request.content)
        ensure_context(flow)
        redact.request(flow)
        assert (flow.request.path, flow.request.headers.fields, flow.request.content) == before
        ctx = context_of(flow)
        assert ctx is not None and ctx.request_view is not None and ctx.request_identity is not None
        text = orjson.dumps(ctx.request_view).decode()
        for secret in ("S3CR3T", "T0KEN", "4111"):
            assert secret not in text
        assert "session=redacted:" in ctx.request_view["url"]
        method, _host, path, query, body_sha = ctx.request_identity
        assert (method, path) == ("GET", "/api") and "redacted:" in query
        assert body_sha == ctx.request_view["body_sha256"]
    assert (tmp_path / "redaction.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("method", "authority", "url"),
    [
        ("GET", "Example.com", "http://Example.com/a/b?x=1&token=redacted:0123456789abcdef"),
        ("post", "127.0.0.1:8080", "https://127.0.0.1:8080/?q"),
        ("GET", "h:1", "http://h:1/"),
        ("GET", "[::1]:8080", "http://[::1]:8080/p?q=1"),
        ("GET", "h", "http://h//double?x"),
    ],
)
def test_fast_identity_matches_mimicry(method: str, authority: str, url: str) -> None:
    """Live calls and recordings must agree on "the same request", or mimicry never matches."""
    assert _identity(method, authority, url, "ab") == identity_from_url(method, url, "ab")


# ------------------------------------------------------------------------------------ real proxy
async def test_no_secret_reaches_disk(
    proxy_factory,  # type: ignore[no-untyped-def]
    backends: Backends,
    redaction_config: Path,
) -> None:
    proxy = proxy_factory("--redaction", str(redaction_config))
    marker = unique("secret")
    secrets = {
        "auth": f"AUTHSECRET{marker}",
        "custom_header": f"HDRSECRET{marker}",
        "json_default": f"PWSECRET{marker}",
        "json_custom": f"CARDSECRET{marker}",
        "query_default": f"QTOKSECRET{marker}",
        "query_custom": f"QSESSSECRET{marker}",
        "response_json": f"RESPSECRET{marker}",
        "response_cookie": f"COOKIESECRET{marker}",
    }
    for backend in backends.all():
        backend.echo = False  # a backend echoing the request inside a string would defeat any blacklist
        backend.respond = {"access_token": secrets["response_json"], "ok": True}
        backend.response_headers = {"Set-Cookie": f"sid={secrets['response_cookie']}; Path=/"}
    async with WorkerClient(proxy, tags=make_tags(message_id=marker)) as client:
        for backend in backends.all():
            for path in ("/full", "/meta", "/ho", "/of"):
                for _ in range(2):  # the same secret twice: the same token
                    reply = await client.call(
                        "POST",
                        f"{backend.url}{path}/{marker}?token={secrets['query_default']}"
                        f"&session={secrets['query_custom']}&plain=visible",
                        headers={
                            "Authorization": f"Bearer {secrets['auth']}",
                            "X-Secret-Header": secrets["custom_header"],
                        },
                        json={
                            "password": secrets["json_default"],
                            "nested": {"card_number": secrets["json_custom"]},
                            "note": "visible",
                        },
                    )
                    assert reply.status == 200
    # Redaction never changes what goes upstream: the backends saw every secret.
    for backend in backends.all():
        assert len(backend.seen) == 8
        seen = backend.seen[0]
        assert seen.header("Authorization") == f"Bearer {secrets['auth']}"
        assert secrets["json_custom"].encode() in seen.body and secrets["query_custom"] in seen.query
    assert proxy.terminate() == 0  # segments closed and compressed
    raw = segment_bytes(proxy.wirelog_dir)
    assert marker.encode() in raw  # the records are there...
    for name, secret in secrets.items():
        assert secret.encode() not in raw, f"{name} secret on disk"  # ...the secrets are not
    assert credential("worker-1").secret.encode() not in raw

    records = with_marker(http_records(proxy.wirelog_dir), marker)
    assert len(records) == 16
    by_path: dict[str, list[dict]] = {}
    for record in records:
        by_path.setdefault(record["request"]["url"].split("/")[3], []).append(record)
    full = by_path["full"]
    # stable tokens: the same secret gives the same token in every record
    assert len({orjson.dumps(r["request"]["headers"]) for r in full if "https" in r["request"]["url"]}) == 1
    first = full[0]["request"]
    assert "plain=visible" in first["url"] and "session=redacted:" in first["url"]
    assert '"note":"visible"' in first["body"].replace(" ", "")
    assert dict(first["headers"])["Authorization"].startswith("Bearer redacted:")
    assert "RESPSECRET" not in full[0]["response"]["body"] and "redacted:" in full[0]["response"]["body"]
    # metadata: no headers, no bodies, but hashes and sizes (so requests still match)
    for record in by_path["meta"] + by_path["of"]:  # on-failure and the call succeeded: metadata
        for part in (record["request"], record["response"]):
            assert part["headers"] is None and part["headers_omitted"]["bytes"] > 0
            assert part["body"] is None and part["body_b64"] is None
            assert part["body_sha256"] and part["body_bytes"] > 0
    for record in by_path["ho"]:
        assert record["request"]["headers"] is None and record["request"]["headers_omitted"] is not None
        assert record["request"]["body"] is not None  # bodies kept (redacted)
    assert {r["level"] for r in by_path["of"]} == {"on-failure"}


async def test_on_failure_logs_failures_in_full(
    proxy_factory,  # type: ignore[no-untyped-def]
    backends: Backends,
    redaction_config: Path,
) -> None:
    proxy = proxy_factory("--redaction", str(redaction_config))
    marker = unique("of")
    async with WorkerClient(proxy) as client:
        failed = await client.call("GET", f"{backends.http.url}/of/{marker}?status=503", headers={"X-A": "1"})
        fine = await client.call("GET", f"{backends.http.url}/of/{marker}?status=200", headers={"X-A": "1"})
    assert (failed.status, fine.status) == (503, 200)
    records = await wait_marked(proxy, marker, 2)
    bad, good = sorted(records, key=lambda r: r["response"]["status"], reverse=True)
    assert bad["response"]["status"] == 503 and ["X-A", "1"] in bad["request"]["headers"]
    assert bad["response"]["body"] is not None
    assert good["request"]["headers"] is None and good["response"]["body"] is None
