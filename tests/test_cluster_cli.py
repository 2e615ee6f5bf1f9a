"""`strictq cluster up | status | move | urls` and `strictq serve --cluster`, as a user runs them: one real
cluster (3 JetStream servers, 3 queue servers, a gateway) started by `strictq cluster up` for the module,
read and changed through the CLI, then stopped with SIGTERM (everything it started must be gone)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_support import (
    Cluster,
    alive,
    nats_pids,
    run,
    settled,
    sqs_client,
    start_cluster,
    status,
)
from kit.until import until_sync

pytestmark = pytest.mark.xdist_group("cluster")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("cluster-up") / "c")
    try:
        yield cluster
    finally:
        cluster.process.stop()


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("strictq: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------------------------- up
def test_up_prints_the_contract_lines_in_order(cluster: Cluster) -> None:
    kinds = []
    for line in cluster.lines:
        match = re.match(
            r"strictq: (listening on|ca|keys|client env|try|node|nats|internal secret|cluster ready)\b", line
        )
        assert match is not None, f"unexpected line {line!r}"
        kinds.append(match.group(1))
    assert kinds == [
        "listening on", "ca", "keys", "client env", "try",
        "node", "node", "node", "nats", "nats", "nats", "internal secret", "cluster ready",
    ]  # fmt: skip
    secret = cluster.data_dir / "internal.secret"  # written once, 0600, handed to every node and the edge
    assert cluster.values("strictq: internal secret ") == [str(secret.resolve())]
    assert secret.stat().st_mode & 0o777 == 0o600
    assert sorted(cluster.nodes) == ["n1", "n2", "n3"]
    for pid, url in cluster.nodes.values():
        assert pid > 0 and url.startswith("http://127.0.0.1:")
    password = json.loads((cluster.data_dir / "nats" / "credentials").read_text())["password"]
    nats = cluster.values("strictq: nats ")
    assert len(nats) == 3 and all(re.fullmatch(r"nats://127\.0\.0\.1:\d+", url) for url in nats)
    assert not any(password in line for line in cluster.lines)
    assert (cluster.data_dir / "logs" / "n1.log").exists() and (
        cluster.data_dir / "logs" / "gateway.log"
    ).exists()
    urls = run("cluster", "urls", "--data-dir", str(cluster.data_dir))
    assert urls.returncode == 0 and urls.stdout.strip() == ",".join(nats)


def test_the_gateway_answers_sqs(cluster: Cluster) -> None:
    sqs = sqs_client(cluster)
    queue = sqs.create_queue(QueueName="orders.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    for n, group in enumerate(["a", "b", "c", "a"]):
        sqs.send_message(
            QueueUrl=queue, MessageBody=f"m{n}", MessageGroupId=group, MessageDeduplicationId=f"d{n}"
        )
    got: list[str] = []

    def drained() -> bool:
        answer = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in answer.get("Messages", []):
            got.append(message["Body"])
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        return len(got) >= 4

    until_sync(drained, within=30, what="the four messages back through the cluster's gateway")
    assert sorted(got) == ["m0", "m1", "m2", "m3"]
    assert got.index("m0") < got.index("m3")  # one group, in order


# ------------------------------------------------------------------------------------------- status
def test_status_shows_every_partition_owned_and_every_node_alive(cluster: Cluster) -> None:
    data = status(cluster)
    assert data["cluster"]["partitions"] == 3 and data["cluster"]["replicas"] == 3
    assert data["cluster"]["nats"] == cluster.values("strictq: nats ")
    nodes = {n["node"]: n for n in data["nodes"]}
    assert set(nodes) == {"n1", "n2", "n3"}
    for name, (pid, url) in cluster.nodes.items():
        assert nodes[name]["state"] == "alive"
        assert (nodes[name]["pid"], nodes[name]["url"]) == (pid, url)
    assert [p["partition"] for p in data["partitions"]] == [0, 1, 2]
    for partition in data["partitions"]:
        assert partition["owner"] in nodes and partition["epoch"] >= 1
        assert partition["partition"] in nodes[partition["owner"]]["serving"]
        assert {s["node"] for s in partition["standbys"]} == set(nodes) - {partition["owner"]}
        for standby in partition["standbys"]:
            assert standby["lag"] == partition["last_seq"] - standby["applied"]
    text = run("cluster", "status", "--data-dir", str(cluster.data_dir))
    assert text.returncode == 0 and "PARTITION" in text.stdout and "alive" in text.stdout


def test_status_of_a_dir_without_a_cluster_is_one_line(tmp_path: Path) -> None:
    one_line(run("cluster", "status", "--data-dir", str(tmp_path)), 1, "no cluster in", str(tmp_path))


# --------------------------------------------------------------------------------------------- move
def test_move_hands_a_partition_to_another_node(cluster: Cluster) -> None:
    until_sync(lambda: settled(status(cluster)), within=30, what="a settled cluster before the move")
    before = status(cluster)["partitions"][1]
    target = next(n for n in ("n1", "n2", "n3") if n != before["owner"])
    done = run("cluster", "move", "1", target, "--wait", "30", "--data-dir", str(cluster.data_dir))
    assert done.returncode == 0, done.stderr
    moved = re.fullmatch(
        rf"strictq: partition 1 moved to {target} \(epoch (\d+)\) in \d+\.\d\ds\n", done.stdout
    )
    assert moved is not None, done.stdout
    epoch = int(moved.group(1))
    assert epoch > before["epoch"]
    after = status(cluster)["partitions"][1]
    # The master may rebalance right after (one node now owns two partitions): then a later epoch.
    assert after["epoch"] > epoch or (after["epoch"] == epoch and after["owner"] == target), after
    owner = after["owner"]
    again = run("cluster", "move", "p1", owner, "--data-dir", str(cluster.data_dir))
    assert again.returncode == 0 and "already on" in again.stdout, (again.stdout, again.stderr)


def test_bad_arguments_are_one_line(cluster: Cluster, tmp_path: Path) -> None:
    where = ("--data-dir", str(cluster.data_dir))
    one_line(run("cluster", "move", "7", "n1", *where), 2, "partition 7 does not exist", "0-2")
    one_line(run("cluster", "move", "0", "n9", *where), 2, "node n9", "alive: n1, n2, n3")
    one_line(run("cluster", "move", "x", "n1", *where), 2, "'x' is not a partition number")
    one_line(run("cluster", "move", "0", "n1", "--wait", "0", *where), 2, "--wait")
    one_line(run("cluster", "up", "--nodes", "0", "--data-dir", str(tmp_path)), 2, "--nodes must be")
    one_line(run("cluster", "up", "--nats-servers", "1", "--data-dir", str(tmp_path)), 2, "--replicas 3")
    one_line(
        run("cluster", "status", "--data-dir", str(tmp_path), "--cluster", "nats://127.0.0.1:1"),
        2,
        "not both",
    )
    gateway = ("serve", "--data-dir", str(tmp_path / "gw"), "--port", "0", "--no-proxy")
    one_line(
        run(*gateway, "--cluster", "nats://u:p@127.0.0.1:1", "--queue-server", "http://127.0.0.1:1"),
        2,
        "--cluster and --queue-server",
    )
    one_line(run(*gateway, "--cluster", "nats://u:p@127.0.0.1:1", "--init"), 2, "--init")
    one_line(run(*gateway, "--cluster", "nats://127.0.0.1:1"), 2, "no NATS credentials")
    # A second `cluster up` on the running data dir is refused before it starts anything.
    one_line(
        run("cluster", "up", "--port", "0", "--no-proxy", *where),
        2,
        "already running",
        str(cluster.process.pid),
    )


# --------------------------------------------------------------------------------------------- stop
def test_a_dead_node_is_reported_and_sigterm_stops_everything(cluster: Cluster) -> None:
    pid, _ = cluster.nodes["n3"]
    os.kill(pid, signal.SIGKILL)
    until_sync(
        lambda: f"strictq: node n3 (pid {pid}) exited with -9" in cluster.process.full_log(),
        within=10,
        what="the supervisor's line about n3",
    )
    started = [p for p, _ in cluster.nodes.values()] + nats_pids(cluster.data_dir)
    assert len(started) == 6
    assert cluster.process.terminate(timeout=60) == 0
    assert "strictq: stopping the cluster" in cluster.process.full_log()
    left = [p for p in started if alive(p)]
    assert not left, f"still running: {left}"
    assert not processes_under(cluster.data_dir), processes_under(cluster.data_dir)


def processes_under(data_dir: Path) -> list[str]:
    """Command lines that name the data dir: a child of `cluster up` left behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(data_dir) in cmdline and alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_region_and_zone_are_checked_before_anything_starts(tmp_path: Path) -> None:
    """--region/--zone name where a queue server runs; bad or cluster-less uses are one line, exit 2."""
    for args, said in (
        (["queue-server", "--region", "eu"], "--region is for a queue server of a cluster"),
        (
            ["queue-server", "--cluster", "nats://u:p@127.0.0.1:1", "--node", "n1", "--zone", "a b"],
            "--zone: 'a b' is not a name",
        ),
    ):
        done = run(*args, "--data-dir", str(tmp_path / "d"))
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
