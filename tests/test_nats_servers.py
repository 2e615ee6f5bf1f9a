"""The JetStream servers the cluster stands on (cluster.nats_servers) and the one way to connect to them
(cluster.connect): real nats-server processes on loopback, real kills."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import uuid
from pathlib import Path

import pytest
from cluster_support import heal, nats1, nats3, nats_client, publish_acked, running_nats
from kit import until

from cluster.connect import (
    NatsSettings,
    NatsUnavailable,
    NatsUrlError,
    connect,
    credentials_from,
    credentials_path,
    system_credentials_path,
)
from cluster.nats_servers import NatsCluster, NatsClusterError, NatsServerMissing, find_nats_server
from wirelog.files import StartupError

__all__ = ["nats1", "nats3"]  # the fixtures this module uses (cluster_support)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_r3_stream_survives_a_killed_server_which_rejoins(nats3: NatsCluster) -> None:
    stream, subject = f"T{uuid.uuid4().hex[:8]}", f"t.{uuid.uuid4().hex[:8]}"
    try:
        async with nats_client(nats3, "test-r3") as nc:
            js = nc.jetstream()
            await js.add_stream(name=stream, subjects=[subject], num_replicas=3)
            first = await publish_acked(js, subject, b"one", msg_id="one")
            assert first.stream == stream and first.seq == 1

            info = await js.stream_info(stream)
            assert info.cluster is not None and info.cluster.leader in nats3.names
            victim = nats3.names.index(info.cluster.leader)  # the stream's leader: the harder case
            pid = nats3.pid(victim)
            assert pid is not None
            nats3.kill(victim)
            assert nats3.pid(victim) is None and _gone(pid)

            second = await publish_acked(js, subject, b"two", msg_id="two")
            assert second.seq == 2 and not second.duplicate

            nats3.start_server(victim)  # waits until it is back in the meta group
            assert nats3.jetstream_peers().get(nats3.names[victim]) is True

            async def replica_current() -> bool:
                cluster = (await js.stream_info(stream)).cluster
                assert cluster is not None
                if cluster.leader == nats3.names[victim]:
                    return True
                return any(r.name == nats3.names[victim] and r.current for r in cluster.replicas or [])

            await until(replica_current, what="the restarted server's replica is current")
            state = (await js.stream_info(stream)).state
            assert state.messages == 2 and state.last_seq == 2
    finally:
        heal(nats3)


def test_files_are_private_and_urls_carry_no_password(nats3: NatsCluster) -> None:
    user, password = nats3.credentials
    assert user and len(password) >= 24
    assert credentials_from(nats3.data_dir) == (user, password)
    for url in nats3.client_urls:
        assert url.startswith("nats://127.0.0.1:") and password not in url and "@" not in url
    seen = 0
    for path in [nats3.root, *nats3.root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, (path, oct(mode))
        else:
            assert mode == 0o600, (path, oct(mode))
        seen += 1
    assert seen > 10  # configs, logs, ports, credentials and the JetStream stores were all checked
    assert stat.S_IMODE(credentials_path(nats3.data_dir).stat().st_mode) == 0o600
    assert password in nats3.config_path(0).read_text()
    assert nats3.version.count(".") == 2


async def test_single_server_restarts_with_its_ports_password_and_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "one"
    with running_nats(data_dir, 1) as first:
        urls, creds, pids = first.client_urls, first.credentials, [first.pid(0)]
        assert "cluster {" not in first.config_path(0).read_text()
        async with nats_client(first) as nc:
            js = nc.jetstream()
            await js.add_stream(name="ONE", subjects=["one"], num_replicas=1)
            await publish_acked(js, "one", b"kept")
    assert pids[0] is not None and first.pid(0) is None and _gone(pids[0])

    again = NatsCluster(data_dir, 1)
    try:
        again.start()
        assert again.client_urls == urls and again.credentials == creds
        assert json.loads((data_dir / "nats" / "ports.json").read_text())["servers"][0]["name"] == "n1"
        async with nats_client(again) as nc:
            info = await nc.jetstream().stream_info("ONE")
            assert info.state.messages == 1
        pid = again.pid(0)
        assert pid is not None
    finally:
        again.stop()
    assert again.pid(0) is None and _gone(pid)


def test_stop_leaves_no_process(nats1: NatsCluster, tmp_path: Path) -> None:
    pid = nats1.pid(0)
    assert pid is not None and not _gone(pid)
    # A second owner of the same data dir is told the server runs, instead of failing on its port.
    with pytest.raises(NatsClusterError, match=rf"already running \(pid {pid}\)"):
        NatsCluster(nats1.data_dir, 1).start()
    assert nats1.pid(0) == pid and not _gone(pid)
    nats1.stop()
    assert nats1.pid(0) is None and _gone(pid)
    nats1.stop()  # twice is fine


async def test_wrong_password_is_refused_at_once_without_echoing_it(nats1: NatsCluster) -> None:
    with pytest.raises(NatsUnavailable, match="refused the login") as raised:
        await connect(nats1.client_urls, "strictq", "not-the-password", name="test-bad", within=30.0)
    assert "not-the-password" not in str(raised.value)


async def test_no_server_fails_within_the_bound(tmp_path: Path) -> None:
    with running_nats(tmp_path / "gone", 1) as cluster:
        urls, creds = cluster.client_urls, cluster.credentials
    with pytest.raises(NatsUnavailable, match=r"cannot connect to NATS at nats://127\.0\.0\.1:"):
        await connect(urls, *creds, name="test-none", within=0.5)


def test_missing_binary_names_the_fix(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(NatsServerMissing) as raised:
        find_nats_server(path=str(empty), fallback=tmp_path / "nats-server")
    assert isinstance(raised.value, StartupError)  # the CLI prints it as one line, exit 2
    message = str(raised.value)
    assert "make cluster" in message and "apt-get install nats-server" in message
    found = find_nats_server(path=str(empty))  # the Debian fallback path (installed by the Makefile)
    assert os.access(found, os.X_OK)
    with pytest.raises(StartupError, match="does not run"):
        NatsCluster(tmp_path / "data", 1, binary=str(tmp_path / "nats-server"))


def test_settings_from_url_arg(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(json.dumps({"user": "u", "password": "secret-pw"}))
    settings = NatsSettings.from_url_arg("nats://h1:4222, h2:4223,nats://h3", creds)
    assert settings.urls == ("nats://h1:4222", "nats://h2:4223", "nats://h3:4222")
    assert (settings.user, settings.password) == ("u", "secret-pw")
    assert "secret-pw" not in repr(settings)

    inline = NatsSettings.from_url_arg("nats://a:b%40c@10.0.0.1:4222,nats://a:b%40c@10.0.0.2:4222", None)
    assert inline.urls == ("nats://10.0.0.1:4222", "nats://10.0.0.2:4222")
    assert (inline.user, inline.password) == ("a", "b@c")

    for bad, why in [
        ("", "no NATS server"),
        ("http://h:1", "scheme"),
        ("nats://h:99999", "not a NATS URL"),
        ("nats://a:x@h:1,nats://a:y@h:2", "different users"),
        ("nats://a@h:1", "both the user and the password"),
        ("nats://h:1", "no NATS credentials"),
    ]:
        with pytest.raises(NatsUrlError, match=why) as raised:
            NatsSettings.from_url_arg(bad, None)
        assert "x@" not in str(raised.value)
    with pytest.raises(StartupError, match="is missing"):
        NatsSettings.from_url_arg("nats://h:1", tmp_path / "absent")
    creds.write_text("not json")
    with pytest.raises(StartupError, match="not a JetStream credentials file"):
        NatsSettings.from_url_arg("nats://h:1", creds)


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket inodes matched in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def test_no_server_opens_a_monitoring_port_yet_start_up_checks_answer(nats3: NatsCluster) -> None:
    """Issue 27: no HTTP monitoring port (it has no login) on any server, only its client and route
    ports; what the start-up checks and the tests need (health, the meta group, a stream's leader) comes
    over NATS as the system account."""
    for i, ports in enumerate(nats3.ports):
        pid = nats3.pid(i)
        assert pid is not None
        assert listening_ports(pid) == {ports.client, ports.cluster}
        config = nats3.config_path(i).read_text()
        assert not re.search(r"^\s*(http|https|http_port|https_port)\s*:", config, re.MULTILINE), config
    # Waited for, not read once: an earlier test of the module may have restarted a server of this cluster.
    await until(lambda: all(nats3.healthy(i) for i in range(nats3.count)), what="every server healthy")
    await until(lambda: set(nats3.jetstream_peers()) == set(nats3.names), what="the meta group's peers")

    def routes() -> bool:
        answer = nats3.monitor(0, "routez")
        return answer is not None and answer["num_routes"] == nats3.count - 1

    await until(routes, what="server 0's routes to the others")
    stream = f"T{uuid.uuid4().hex[:8]}"
    async with nats_client(nats3, "test-leader") as nc:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"t.{stream}"], num_replicas=3)
        try:
            info = await js.stream_info(stream)
            assert info.cluster is not None and info.cluster.leader in nats3.names

            def leaders() -> set[str]:
                """The stream's leader as each server's JSZ names it (a new stream's may lag a moment)."""
                return {
                    (detail.get("cluster") or {}).get("leader")
                    for i in range(nats3.count)
                    for account in (nats3.monitor(i, "jsz", {"streams": True}) or {}).get("account_details")
                    or []
                    for detail in account.get("stream_detail") or []
                    if detail["name"] == stream
                }

            await until(lambda: leaders() == {info.cluster.leader}, what="JSZ naming the stream's leader")
        finally:
            await js.delete_stream(stream)
    saved = json.loads((nats3.root / "ports.json").read_text())["servers"]
    assert all(set(server) == {"name", "client", "cluster"} for server in saved)


def test_a_data_dir_from_before_keeps_its_ports_and_drops_the_monitoring_one(tmp_path: Path) -> None:
    """ports.json written when servers had a monitoring port: the same client port, no `http` port
    opened, and a system login made for the start-up checks."""
    with running_nats(tmp_path / "old", 1) as first:
        client = first.ports[0].client
    record = json.loads((first.root / "ports.json").read_text())
    record["servers"][0]["http"] = 1  # as older versions wrote it (port 1: never one to listen on)
    (first.root / "ports.json").write_text(json.dumps(record))
    system_credentials_path(first.data_dir).unlink()
    with running_nats(first.data_dir, 1) as again:
        pid = again.pid(0)
        assert pid is not None and listening_ports(pid) == {client}
        assert again.healthy(0) and again.system_credentials[1] in again.config_path(0).read_text()
