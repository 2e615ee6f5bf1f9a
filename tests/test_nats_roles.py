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

from cluster_support import nats1  # noqa: F401  (a fixture)
from nats.aio.client import Client

from cluster.connect import connect, credentials_path, gateway_credentials_path, read_cluster_id
from cluster.layout import ClusterLayout, ensure_layout, ensure_streams
from cluster.nats_roles import GATEWAY_USER
from cluster.nats_servers import NatsCluster

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
