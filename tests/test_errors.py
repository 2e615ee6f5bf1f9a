"""One error model (issue 13 item 2): every error class carries its status, whether it is retriable and a
snake_case code, and the same error gets the same status and body shape on the internal API, the admin
routes, the EmoDB face and search (docs/errors.md).

The apps are the real ones (queue_core.server.make_app, gateway.app.make_gateway_app with the search route)
on 127.0.0.1 sockets, over one in-process QueueService.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from access.keys import Credential, KeyRing
from gateway.app import make_gateway_app
from protocol.errors import HTTP_ERROR_CODES, StrictqError, parse_error, snake_code
from queue_core.admin_http import search_gate
from queue_core.client import QueueClient, QueueClientError
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.http_errors import error_response
from queue_core.machine import (
    AlreadyExists,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    NotInFlight,
    NotOwner,
    QueueNotFound,
    StaleClaim,
    TooLarge,
    Unavailable,
    error_from_dict,
)
from queue_core.machine.errors import Gone
from queue_core.server import make_app
from queue_core.service import QueueService
from queue_core.store import StoreDataError, StoreError
from spark.admin_endpoint import SearchGate, add_search_route

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "access", "queue_core", "gateway", "fencing", "spark", "strictq", "wirelog")
# Every module that defines error classes, so that the class walk below sees them all.
ERROR_MODULES = (
    "queue_core.machine.errors",
    "queue_core.fences",
    "queue_core.store",
    "queue_core.admin_http",
    "queue_core.health_http",
    "queue_core.retry_http",
    "access.permissions",
    "gateway.emodb",
    "spark.admin_endpoint",
)
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
BODY_KEYS = {"code", "message", "retriable", "details"}
CREDENTIALS = [
    Credential("admin-1", "admin-secret-0123456789", "admin", "t1"),
    Credential("worker-1", "worker-secret-0123456789", "worker", "t1"),
    Credential("producer-1", "producer-secret-0123456789", "producer", "t1"),
]


def secret(key_id: str) -> dict[str, str]:
    return {"X-BV-API-Key": next(c.secret for c in CREDENTIALS if c.id == key_id)}


def all_error_classes() -> list[type[StrictqError]]:
    for module in ERROR_MODULES:
        importlib.import_module(module)
    seen: list[type[StrictqError]] = []
    todo: list[type[StrictqError]] = [StrictqError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


def error_of(body: Any) -> dict[str, Any]:
    """The error object of the one body shape, checked: {"error": {code, message, retriable?, details?}}."""
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    error = body["error"]
    assert set(error) <= BODY_KEYS and {"code", "message"} <= set(error), body
    assert isinstance(error["code"], str) and SNAKE.fullmatch(error["code"]), body
    assert isinstance(error["message"], str) and error["message"], body
    assert error.get("retriable", True) is True, body  # present only when true
    return error


# ---------------------------------------------------------------------------------------- the classes
def test_every_error_class_carries_a_status_retriable_and_a_snake_case_code() -> None:
    classes = all_error_classes()
    assert len(classes) > 20, classes  # the walk found the families of every module above
    for cls in classes:
        assert isinstance(cls.status, int) and 400 <= cls.status <= 599, cls
        assert isinstance(cls.retriable, bool), cls
        assert isinstance(cls.code, str) and SNAKE.fullmatch(cls.code), cls
        if cls.retriable:  # a retry can only help where the server, not the request, was the problem
            # (421: a cluster node that does not own the partition; its current owner may answer)
            assert cls.status in (421, 429, 503), cls


@pytest.mark.parametrize(
    ("cls", "status", "code", "retriable"),
    [
        (NotFound, 404, "not_found", False),
        (QueueNotFound, 404, "queue_not_found", False),
        (InvalidArgument, 400, "invalid_argument", False),
        (AlreadyExists, 409, "already_exists", False),
        (StaleClaim, 409, "stale_claim", False),
        (NotInFlight, 409, "not_in_flight", False),
        (Gone, 409, "gone", False),
        (TooLarge, 413, "too_large", False),
        (LimitExceeded, 429, "limit_exceeded", False),
        (Unavailable, 503, "unavailable", True),
        (NotOwner, 421, "not_owner", True),
        (StoreError, 503, "store_unavailable", True),
        (StoreDataError, 500, "store_refused", False),
    ],
)
def test_the_decided_status_of_each_core_error(
    cls: type[StrictqError], status: int, code: str, retriable: bool
) -> None:
    """Where the copies disagreed (LimitExceeded was 400 on the internal API; StaleClaim, NotInFlight and
    AlreadyExists fell to 400 on the admin routes), the one status now."""
    assert (cls.status, cls.code, cls.retriable) == (status, code, retriable)
    response = error_response(cls("some text"))
    assert response.status == status
    error = error_of(orjson.loads(response.body))  # type: ignore[arg-type]
    assert (error["code"], error.get("retriable", False)) == (code, retriable)


def test_the_renderer_hides_internal_text_and_sets_retry_after() -> None:
    refused = error_response(StoreDataError("integer 99999999999999999999 out of range in /data/x.db"))
    error = error_of(orjson.loads(refused.body))  # type: ignore[arg-type]
    assert "/data" not in error["message"] and "9999" not in error["message"], error
    later = LimitExceeded("slow down")
    later.retry_after = 2.2
    response = error_response(later)
    assert (response.status, response.headers["Retry-After"]) == (429, "3")
    boom = error_response(RuntimeError("secret detail"))
    assert boom.status == 500 and error_of(orjson.loads(boom.body))["code"] == "internal"  # type: ignore[arg-type]
    assert b"secret detail" not in boom.body  # type: ignore[operator]


def test_clients_read_both_shapes_and_both_casings() -> None:
    new = {"error": {"code": "stale_lease", "message": "m", "retriable": True, "details": {"ids": ["a"]}}}
    assert parse_error(new).code == "stale_lease" and parse_error(new).retriable
    assert parse_error(new).details == {"ids": ["a"]}
    old_admin = {"code": "unknown-worker", "message": "no such worker"}
    assert (parse_error(old_admin).code, parse_error(old_admin).message) == (
        "unknown_worker",
        "no such worker",
    )
    old_proxy = {"code": "stale-lease", "action": "stale-lease", "message": "below the floor"}
    assert parse_error(old_proxy).code == "stale_lease"
    assert parse_error(b"not json").code == "http_error"
    rebuilt = error_from_dict({"code": "stale-claim", "message": "superseded", "details": {"token": 3}})
    assert isinstance(rebuilt, StaleClaim) and rebuilt.details == {"token": 3}
    unknown = error_from_dict({"code": "brand_new_code", "message": "from a newer server"})
    assert unknown.code == "brand_new_code" and unknown.status == 400


# ----------------------------------------------------------------------------------- one casing, source
def _code_literals(tree: ast.AST, error_names: set[str]) -> Iterator[tuple[int, str]]:
    """String literals that are error codes: `code = "..."` in a class, `code="..."` keywords, the value
    of a `"code"` key, and the code argument of a call to an error class (`InvalidFence(msg, "bad_x")`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "code" for t in node.targets
        ):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                yield node.lineno, node.value.value
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant):
                    if isinstance(keyword.value.value, str):
                        yield node.lineno, keyword.value.value
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in error_names and len(node.args) == 2:
                code = node.args[1]
                if isinstance(code, ast.Constant) and isinstance(code.value, str):
                    yield node.lineno, code.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code" and isinstance(value, ast.Constant):
                    if isinstance(value.value, str):
                        yield node.lineno, value.value


def test_no_kebab_case_error_code_remains_in_the_code_tables() -> None:
    error_names = {cls.__name__ for cls in all_error_classes()}  # their (message, code) constructors
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for line, code in _code_literals(tree, error_names):
                if code and code != "-" and not SNAKE.fullmatch(code):
                    found.append(f"{path.relative_to(ROOT)}:{line}: {code!r}")
    assert not found, "\n".join(found)
    assert all(SNAKE.fullmatch(code) for code in HTTP_ERROR_CODES.values())
    assert snake_code("tenant-not-served") == "tenant_not_served"


# ------------------------------------------------------------------------------- the same on every API
@dataclass
class Apps:
    internal: str  # the queue server's internal API
    gateway: str  # the EmoDB face, the admin routes and search
    service: QueueService


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def apps(tmp_path: Path) -> AsyncIterator[Apps]:
    service = QueueService(tmp_path / "queue")
    await service.start()
    keys = KeyRing(list(CREDENTIALS))
    manager = FailureManager(service, ControlHub(service), wirelog=tmp_path / "events")
    gateway_app = make_gateway_app(service, keys, failures=manager)  # + admin and failure routes
    gate = SearchGate(*search_gate(gateway_app, keys))
    add_search_route(gateway_app, tmp_path / "index", gate)  # no index built: 404 no_index
    try:
        async with serving(make_app(service, secret=None)) as internal, serving(gateway_app) as gateway:
            yield Apps(internal, gateway, service)
    finally:
        service.stop_waiting()
        await service.close()


async def call(
    url: str, method: str, body: Any = None, headers: dict[str, str] | None = None, **params: str
) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.request(
            method,
            url,
            data=None if body is None else orjson.dumps(body),
            params=params or None,
            headers={**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})},
        ) as response,
    ):
        raw = await response.read()
        return response.status, orjson.loads(raw) if raw else None, dict(response.headers)


async def test_not_found_is_404_not_found_on_the_internal_api_admin_and_emodb(apps: Apps) -> None:
    await apps.service.send("t1.orders", [_request("a", "g1")], create=True)
    answers = [
        await call(apps.internal + "/v1/moves/nope", "GET"),
        await call(apps.gateway + "/queue/1/_move/nope", "GET", headers=secret("admin-1")),
        await call(
            apps.gateway + "/admin/v1/queues/orders/groups/release",
            "POST",
            headers=secret("admin-1"),
            group="nope",
        ),
    ]
    for status, body, _ in answers:
        assert (status, error_of(body)["code"]) == (404, "not_found"), body


async def test_a_stale_claim_is_409_stale_claim_on_the_internal_api_and_emodb(apps: Apps) -> None:
    async with QueueClient(apps.internal, timeout=30.0) as client:
        await client.send_one("plain", "x", group="g1")
        (first,) = await client.receive("plain", limit=1, ttl=60, worker="w")
        await client.release("plain", [first["receipt"]])
        (second,) = await client.receive("plain", limit=1, ttl=60, worker="w")
        assert second["token"] > first["token"]
        with pytest.raises(QueueClientError) as refused:
            await client.request("POST", "/v1/queues/plain/ack", {"receipts": [first["receipt"]]})
    internal_status, internal_code = refused.value.status, refused.value.code

    worker = secret("worker-1")
    base = apps.gateway + "/queue/1/jobs"
    assert (await call(base + "/send", "POST", {"n": 1}, secret("producer-1"), group="g1"))[0] == 200
    _, (old,), _ = await call(base + "/poll", "GET", headers=worker, ttl="60")
    assert (await call(base + "/renew", "POST", [old["id"]], worker, ttl="0", token=str(old["token"])))[
        0
    ] == 200
    _, (new,), _ = await call(base + "/poll", "GET", headers=worker, ttl="60")
    assert new["token"] > old["token"]
    status, body, _ = await call(base + "/ack", "POST", [old["id"]], worker, token=str(old["token"]))
    assert (status, error_of(body)["code"]) == (internal_status, internal_code) == (409, "stale_claim"), body


async def test_unknown_routes_and_methods_answer_alike_everywhere(apps: Apps) -> None:
    admin = secret("admin-1")
    for url, headers in (
        (apps.internal + "/v1/nothing/here", None),
        (apps.gateway + "/admin/v1/nothing", admin),
        (apps.gateway + "/queue/1/a/b/c/d", admin),
    ):
        status, body, _ = await call(url, "GET", headers=headers)
        assert (status, error_of(body)["code"]) == (404, "no_such_route"), (url, body)
    for url in (
        apps.internal + "/healthz",
        apps.gateway + "/admin/v1/search",
        apps.gateway + "/queue/1/x/poll",
    ):
        status, body, response_headers = await call(url, "POST", {}, admin)
        assert (status, error_of(body)["code"]) == (405, "method_not_allowed"), (url, body)
        assert "GET" in response_headers["Allow"]


async def test_auth_errors_of_admin_routes_and_search_share_one_shape(apps: Apps) -> None:
    for path in ("/admin/v1/fences", "/admin/v1/status", "/admin/v1/search"):
        status, body, _ = await call(apps.gateway + path, "GET")
        assert (status, error_of(body)["code"]) == (401, "unauthorized"), (path, body)
        status, body, _ = await call(apps.gateway + path, "GET", headers=secret("worker-1"))
        assert (status, error_of(body)["code"]) == (403, "forbidden"), (path, body)
    # The EmoDB face's own refusal of a role (EmoDB answers 403 to a missing key too) has the same shape.
    status, body, _ = await call(apps.gateway + "/queue/1/jobs/peek", "GET", headers=secret("worker-1"))
    assert (status, error_of(body)["code"]) == (403, "forbidden"), body
    status, body, _ = await call(
        apps.gateway + "/admin/v1/search", "GET", headers=secret("admin-1"), group="g"
    )
    assert (status, error_of(body)["code"]) == (404, "no_index"), body
    status, body, _ = await call(
        apps.gateway + "/admin/v1/search", "GET", headers=secret("admin-1"), limit="0"
    )
    error = error_of(body)
    assert (status, error["code"], error["details"]) == (400, "invalid_parameter", {"field": "limit"}), body


async def test_admin_and_failure_routes_use_snake_codes_and_their_statuses(apps: Apps) -> None:
    admin = secret("admin-1")
    status, body, _ = await call(apps.gateway + "/admin/v1/fences/ghost", "DELETE", headers=admin)
    assert (status, error_of(body)["code"]) == (404, "unknown_worker"), body
    status, body, _ = await call(apps.gateway + "/admin/v1/fences/worker-1", "DELETE", headers=admin)
    assert (status, error_of(body)["code"]) == (404, "not_fenced"), body
    status, body, _ = await call(apps.gateway + "/admin/v1/fences/worker-1", "PUT", {"mode": "x"}, admin)
    assert (status, error_of(body)["code"]) == (400, "bad_mode"), body
    status, body, _ = await call(
        apps.gateway + "/admin/v1/queues/nope/suspend", "POST", {"reason": "r"}, admin
    )
    assert (status, error_of(body)["code"]) == (404, "queue_not_found"), body
    status, body, _ = await call(apps.gateway + "/admin/v1/blacklist/worker-1", "DELETE", headers=admin)
    assert (status, error_of(body)["code"]) == (404, "not_blacklisted"), body
    big = {"reason": "x" * (70 * 1024)}
    status, body, _ = await call(apps.gateway + "/admin/v1/alerts", "POST", big, admin)
    assert (status, error_of(body)["code"]) == (413, "request_too_large"), body


def _request(body: str, group: str) -> Any:
    from queue_core.machine import SendRequest

    return SendRequest(body=body.encode(), group=group)
