"""NATS users per role (issue 27, "internal traffic authenticated"; cluster.nats_roles): the edges' login
reads what an edge needs and writes only an edge's buckets, but cannot forge a partition's frames, rewrite
the owner map, or change or delete streams. Real nats-server, real nats-py clients; each refused attempt
is checked by reading the state back with the queue servers' login, not by the client's error alone."""

from __future__ import annotations

import contextlib
import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from cluster_support import nats1  # noqa: F401  (a fixture)
from kit import until
from nats.aio.client import Client

from cluster.connect import (
    connect,
    credentials_path,
    gateway_credentials_path,
    read_cluster_id,
    system_credentials_path,
)
from cluster.layout import ClusterLayout, ensure_layout, ensure_streams
from cluster.nats_roles import GATEWAY_USER, SYSTEM_USER
from cluster.nats_servers import NatsCluster
from cluster.nats_system import SystemLogin, SystemLoginRefused, ask

REFUSED_WITHIN = 2.0  # a refused publish is dropped by the server: its ack never comes


@contextlib.asynccontextmanager
async def login(cluster: NatsCluster, credentials: tuple[str, str], name: str) -> AsyncIterator[Client]:
    client = await connect(cluster.client_urls, *credentials, name=name)
    try:
        yield client
    finally:
        await client.close()


async def layout_of(cluster: NatsCluster) -> ClusterLayout:
    async with login(cluster, cluster.credentials, "setup") as nc:
        layout = await ensure_layout(nc.jetstream(), 2, 1, cluster_id=cluster.cluster_id)
        await ensure_streams(nc.jetstream(), layout)
        return layout


async def refused(operation: Any) -> bool:
    """Whether `operation` failed (a refused publish times out or is answered with an error)."""
    try:
        await operation
    except Exception:
        return True
    return False


def test_the_edges_file_holds_only_their_login(nats1: NatsCluster) -> None:  # noqa: F811
    path = gateway_credentials_path(nats1.data_dir)
    data = json.loads(path.read_text())
    assert data["user"] == GATEWAY_USER and data["password"] != nats1.credentials[1]
    assert data["cluster"] == nats1.cluster_id == read_cluster_id(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_the_gateway_login_reads_and_writes_an_edges_buckets_only(nats1: NatsCluster) -> None:  # noqa: F811
    layout = await layout_of(nats1)
    assert layout.id == nats1.cluster_id  # the id the permissions name
    async with (
        login(nats1, nats1.credentials, "server") as server,
        login(nats1, nats1.gateway_credentials, "gateway") as gateway,
    ):
        sjs, gjs = server.jetstream(), gateway.jetstream(timeout=REFUSED_WITHIN)
        owners = await sjs.key_value(layout.owners_bucket)
        await owners.put("p0", b"n1")
        # What an edge does: read the owner map, write its traffic report.
        assert (await (await gjs.key_value(layout.owners_bucket)).get("p0")).value == b"n1"
        await (await gjs.key_value(layout.edges_bucket)).put("edge-1", b"{}")
        assert (await (await sjs.key_value(layout.edges_bucket)).get("edge-1")).value == b"{}"

        before = (await sjs.stream_info(layout.stream(0))).state.messages
        frame = gjs.publish(layout.subject(0), b"forged", timeout=REFUSED_WITHIN)
        assert await refused(frame)
        takeover = (await gjs.key_value(layout.owners_bucket)).put("p0", b"evil")
        assert await refused(takeover)
        assert await refused(gjs.delete_stream(layout.stream(0)))
        assert await refused(gjs.purge_stream(layout.stream(1)))

        # Nothing changed: the stream, the owner map, the other stream are as they were.
        assert (await sjs.stream_info(layout.stream(0))).state.messages == before
        assert (await owners.get("p0")).value == b"n1"
        assert (await sjs.stream_info(layout.stream(1))).config.name == layout.stream(1)
        # The queue servers' login keeps every right.
        await sjs.publish(layout.subject(0), b"frame", timeout=10)
        assert (await sjs.stream_info(layout.stream(0))).state.messages == before + 1


def test_a_data_dir_made_before_roles_keeps_its_one_login(tmp_path: Path) -> None:
    """An old credentials file (no gateway login, no cluster id) still configures one user, for edges too."""
    path = credentials_path(tmp_path)
    path.parent.mkdir(parents=True, mode=0o700)
    old = {"user": "strictq", "password": "p" * 24, "route_user": "route", "route_password": "r" * 24}
    path.write_text(json.dumps(old))
    path.chmod(0o600)
    cluster = NatsCluster(tmp_path, 1)
    assert cluster.gateway_credentials == cluster.credentials == ("strictq", "p" * 24)
    assert cluster.cluster_id is None
    assert not gateway_credentials_path(tmp_path).exists()
    assert f'user: "{GATEWAY_USER}"' not in cluster.config_path(0).read_text()


def test_cluster_up_gives_the_edge_the_gateway_login_and_the_nodes_theirs(tmp_path: Path) -> None:
    from strictq.cluster_up import ClusterUp, UpOptions

    up = ClusterUp(UpOptions(tmp_path, nats_servers=1))
    up.nats = NatsCluster(tmp_path, 1)
    assert up.nats.cluster_id is not None  # credentials (and the edges' file) made on first use

    def credentials_of(argv: list[str]) -> str:
        return argv[argv.index("--nats-credentials") + 1]

    assert credentials_of(up.gateway_argv()) == str(gateway_credentials_path(tmp_path))
    assert credentials_of(up.node_argv("n1")) == str(credentials_path(tmp_path))


# ------------------------------------------------------------------ the servers' own state (issue 27)
SYSTEM_REQUESTS = (
    "$SYS.REQ.SERVER.PING.JSZ",  # every stream's layout and leader
    "$SYS.REQ.SERVER.PING.HEALTHZ",
    "$SYS.REQ.SERVER.PING.VARZ",
    "$SYS.REQ.SERVER.PING.CONNZ",  # imported into every account by default: its connections
    "$SYS.REQ.ACCOUNT.PING.CONNZ",
    "$SYS.REQ.ACCOUNT.PING.STATZ",
    "$SYS.REQ.USER.INFO",
)


async def system_requests_of(cluster: NatsCluster, credentials: tuple[str, str]) -> tuple[list[str], int]:
    """Send every system request with a login: the errors the server sends back (one per subject once
    all have come) and how many answers came."""
    errors: list[str] = []

    async def record(error: Exception) -> None:
        errors.append(str(error).lower())

    client = await nats.connect(
        cluster.client_urls, user=credentials[0], password=credentials[1], error_cb=record
    )
    try:
        subjects = (*SYSTEM_REQUESTS, f"$SYS.REQ.SERVER.{client._server_info['server_id']}.JSZ")
        inbox = await client.subscribe(client.new_inbox())
        for subject in subjects:
            await client.publish(subject, b'{"streams": true}', reply=inbox.subject)
        await until(lambda: len(errors) >= len(subjects), what="a permission error per system request")
        await client.flush()
        return errors, inbox.pending_msgs
    finally:
        await client.close()


async def test_only_the_system_login_learns_the_servers_state(nats1: NatsCluster) -> None:  # noqa: F811
    """The cluster's own logins (a gateway's, a queue server's) get a permissions violation on the system
    account's requests and no answer; the system login, in its own 0600 file, gets the layout and leaders,
    and is no user of the cluster's account (it cannot read a stream)."""
    layout = await layout_of(nats1)
    path = system_credentials_path(nats1.data_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tuple(json.loads(path.read_text()).values()) == nats1.system_credentials
    assert nats1.system_credentials[0] == SYSTEM_USER

    for role, credentials in (("gateway", nats1.gateway_credentials), ("server", nats1.credentials)):
        errors, answers = await system_requests_of(nats1, credentials)
        assert answers == 0, f"the {role} login was answered"
        assert all(e.startswith('nats: permissions violation for publish to "$sys.req.') for e in errors)
        # The one-shot asker of cluster.nats_system, with this login: no answer either.
        host, port = nats1.client_urls[0].removeprefix("nats://").rsplit(":", 1)
        assert ask(host, int(port), SystemLogin(*credentials), "jsz", {"streams": True}) is None

    answer = nats1.monitor(0, "jsz", {"streams": True})
    assert answer is not None
    streams = [d["name"] for a in answer.get("account_details") or [] for d in a.get("stream_detail") or []]
    assert layout.stream(0) in streams  # what the start-up checks and the tests may know
    with pytest.raises(SystemLoginRefused):
        ask(host, int(port), SystemLogin(SYSTEM_USER, "not-the-password"), "healthz")
    # The system login has no rights in the cluster's account: no stream of the queue is visible to it.
    async with login(nats1, nats1.system_credentials, "system") as system:
        assert await refused(system.jetstream(timeout=REFUSED_WITHIN).stream_info(layout.stream(0)))


async def test_the_system_login_only_asks_read_only_questions(nats1: NatsCluster) -> None:  # noqa: F811
    """The system login may ask a server about itself (HEALTHZ, JSZ, ...) and nothing more: a reload, a
    kick or lame-duck mode is a permissions violation and is never carried out (the server still answers)."""
    errors: list[str] = []

    async def record(error: Exception) -> None:
        errors.append(str(error).lower())

    user, password = nats1.system_credentials
    client = await nats.connect(nats1.client_urls, user=user, password=password, error_cb=record)
    try:
        server = client._server_info["server_id"]
        answer = await client.request(f"$SYS.REQ.SERVER.{server}.HEALTHZ", b"", timeout=5)
        assert b'"status"' in answer.data
        forbidden = [f"$SYS.REQ.SERVER.{server}.{what}" for what in ("RELOAD", "KICK", "LDM")]
        for subject in forbidden:
            await client.publish(subject, b"{}", reply=client.new_inbox())
        await until(lambda: len(errors) >= len(forbidden), what="a permission error per forbidden request")
        assert all(e.startswith('nats: permissions violation for publish to "$sys.req.') for e in errors)
    finally:
        await client.close()
    assert nats1.healthy(0)  # not in lame-duck mode, still serving
