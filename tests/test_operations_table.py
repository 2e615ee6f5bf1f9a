"""The internal API's table (queue_core.operations) against what really serves and calls it: the routes the
real queue server's app mounts, the QueueBackend port's methods, and how cluster/backend.py spreads each
call over real queue servers (one per partition, as in tests/test_cluster_backend.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

from aiohttp import web

from access.keys import KeyRing
from queue_core import operations
from queue_core.backend import QueueBackend
from queue_core.internal_auth import KEYED_PREFIXES, InternalSecret
from queue_core.machine import NotFound
from queue_core.machine.fleet import FleetSettings
from queue_core.machine.health import HealthSettings
from queue_core.operations import BY_NAME, LOCAL_ONLY, OPERATIONS, PORT, Serving
from queue_core.server import make_app
from queue_core.service import QueueService
from strictq.queue_server import compose_app

TABLE = {(op.method, op.path) for op in OPERATIONS}


def internal_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path template) of every internal route of `app`: not the keyed admin API, not the HEAD
    that aiohttp adds beside each GET."""
    found = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method != "HEAD" and not path.startswith(KEYED_PREFIXES):
            found.add((route.method, path))
    return found


def test_the_queue_server_mounts_exactly_the_table(tmp_path: Path) -> None:
    service = QueueService(tmp_path, partitions=4)
    secret = InternalSecret("s" * 32)
    app = compose_app(service, secret, KeyRing([]), tmp_path, HealthSettings(), FleetSettings())
    assert internal_routes(app) == TABLE
    bare = compose_app(service, secret, KeyRing([]), tmp_path, None, None)  # --no-health: same routes
    assert internal_routes(bare) == TABLE


def test_a_cluster_node_mounts_what_is_not_the_clusters_once() -> None:
    """A node serves its partitions' operations; the cluster-wide control state is not a node's."""
    app = make_app(None, source=lambda request: None, ready=lambda: True, secret=None)  # type: ignore[arg-type,return-value]
    node = {(op.method, op.path) for op in OPERATIONS if op.serving is not Serving.CLUSTER}
    assert internal_routes(app) == node


def test_names_are_unique_and_paths_are_templates() -> None:
    assert len(BY_NAME) == len(OPERATIONS)
    assert len(TABLE) == len(OPERATIONS)
    for op in OPERATIONS:
        assert op.path.startswith("/"), op.name
        assert op.method in ("GET", "PUT", "POST", "PATCH", "DELETE"), op.name


def test_every_port_method_is_an_operation_or_local() -> None:
    members = {name for name, _ in inspect.getmembers(QueueBackend) if not name.startswith("_")} | set(
        QueueBackend.__annotations__
    )
    assert members == set(PORT) | set(LOCAL_ONLY)
    assert not set(PORT) & set(LOCAL_ONLY)
    for method, port in PORT.items():
        assert port.operation in BY_NAME, method


def test_quoting_and_move_references() -> None:
    call = operations.SEND.bind("a/b?c", [], create=False)
    assert call.path == "/v1/queues/a%2Fb%3Fc/send"
    assert call.request.body == {"messages": [], "create": False}
    for reference in ("", ".", ".."):
        try:
            operations.MOVE_STATUS.bind(reference)
        except NotFound:
            continue
        raise AssertionError(f"{reference!r} is no move")
