"""The internal API's table (queue_core.operations) against what really serves and calls it: the routes the
real queue server's app mounts, the QueueBackend port's methods, and how cluster/backend.py spreads each
call over real queue servers (one per partition, as in tests/test_cluster_backend.py)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from conftest import ServerProcess, running_servers
from kit.secret import internal_secret
from kit.until import until

from access.keys import KeyRing
from cluster.backend import ClusterBackend
from cluster.owners import StaticOwnerMap
from queue_core import operations
from queue_core.backend import QueueBackend
from queue_core.internal_auth import KEYED_PREFIXES, InternalSecret
from queue_core.machine import NotFound, QueueError, SendRequest, SendResult
from queue_core.machine.fleet import FleetSettings
from queue_core.machine.groups import partition_of
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


# ------------------------------------------------------------------ the cluster serves as the table says
P = 2


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """One real queue server per partition, as tests/test_cluster_backend.py has them."""
    with running_servers(tmp_path_factory.mktemp("optable"), P) as started:
        yield started


async def test_the_cluster_spreads_each_call_as_the_table_says(servers: list[ServerProcess]) -> None:
    backend = ClusterBackend(
        StaticOwnerMap([s.url for s in servers]),
        retry_budget=0.5,
        probe_interval=0.1,
        secret=internal_secret(),
    )
    await backend.start()
    everyone = set(range(P))
    queue, other, group = "optable", "optable-to", "customer-1"
    home = partition_of(group, P)

    async def touched(method: str, run: Callable[[], Awaitable[object]]) -> set[int]:
        """The partitions `run` sent the port method's operation to (answered or refused: a group with
        nothing to release is NotFound, from the partitions asked)."""
        operation = PORT[method].operation
        before = {p: c[operation] for p, c in backend.calls().items()}
        with contextlib.suppress(NotFound):
            await run()
        return {p for p, c in backend.calls().items() if c[operation] > before.get(p, 0)}

    def expected(method: str, group_home: int) -> set[int] | None:
        """The partitions the table says; None: any one."""
        serving = operations.serving_of(method)
        if serving is Serving.FAN_OUT:
            return everyone
        if serving in (Serving.GROUP, Serving.MESSAGE):
            return {group_home}
        assert serving is Serving.ANY, (method, serving)
        return None

    try:
        sent: list[SendResult | QueueError] = []

        async def send() -> None:
            sent.extend(await backend.send(queue, [SendRequest(b"one", group=group)]))

        async def ack() -> None:
            (result,) = sent
            assert isinstance(result, SendResult)
            (item,) = await backend.receive(queue, limit=10)
            await backend.ack(queue, [(item.delivery.message_id, item.delivery.token)])

        cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("create_queue", lambda: backend.create_queue(queue)),
            ("set_attributes", lambda: backend.set_attributes(queue, {"visibility_timeout": 20})),
            ("attributes", lambda: backend.attributes(queue)),
            ("list_queues", lambda: backend.list_queues()),
            ("metrics", lambda: backend.metrics(queue)),
            ("send", send),
            ("group_metrics", lambda: backend.group_metrics(queue, group)),
            ("peek", lambda: backend.peek(queue)),
            ("ack", ack),
            ("release_group", lambda: backend.release_group(queue, group)),
            ("group_policy", lambda: backend.group_policy(queue, group)),
            ("group_log", lambda: backend.group_log(queue, group)),
            ("parked_groups", lambda: backend.parked_groups(queue)),
            ("handovers", lambda: backend.handovers(queue)),
            ("version_figures", lambda: backend.version_figures(queue, 30.0)),
            ("unclaim_all", lambda: backend.unclaim_all(queue)),
            ("purge", lambda: backend.purge(queue)),
        ]
        await backend.create_queue(other)
        for method, run in cases:
            found = await touched(method, run)
            wanted = expected(method, home)
            if wanted is None:
                assert len(found) == 1, (method, found)
            else:
                assert found == wanted, (method, found, wanted)
        move = await backend.start_move(queue, other)
        assert {p for p, c in backend.calls().items() if c["start_move"]} == everyone
        assert operations.serving_of("start_move") is Serving.FAN_OUT
        await until(lambda: _done(backend, move.id), what="the move to end")
    finally:
        await backend.close()


async def _done(backend: ClusterBackend, move_id: str) -> bool:
    return (await backend.move_status(move_id)).state != "running"
