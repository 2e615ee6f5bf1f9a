"""`strictq cluster placement | plan` and the geography of `strictq cluster status`, as an operator runs
them: the options' checks through the real CLI, then one real `strictq cluster up --regions eu,us,ap` for
the module (n1 in eu, n2 in us, n3 in ap; its gateway is an edge without a region).

The traffic that drives `plan` is an edge report written into the cluster's real edges bucket with
nats-py (cluster.traffic.EdgeReport, as an edge in us would publish it): the cluster-up gateway's own
reports carry no client region (it has none), and a producer really in another region is the scenario
tests' business (tests/test_geo_placement.py, over the simulated WAN).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_support import Cluster, run, running_nats, settled, start_cluster, status
from kit.until import until_sync

from cluster.connect import connect, credentials_path, read_credentials
from cluster.layout import ensure_layout, ensure_streams, read_layout
from cluster.traffic import EdgeReport, NodeLatency, PartitionTraffic
from strictq.cluster_view import recorded_nats_urls

pytestmark = pytest.mark.xdist_group("cluster")

US_EDGE = "edge-us-test"
RTT_FROM_US = {"eu": 80.0, "us": 1.0, "ap": 180.0}  # ms, as the us edge would measure them


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("geo-cli") / "c", "--regions", "eu,us,ap")
    try:
        yield cluster
    finally:
        cluster.process.stop()


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run("cluster", *args, "--data-dir", str(cluster.data_dir))


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("strictq: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def put_report(cluster: Cluster, rates: dict[int, dict[str, float]]) -> None:
    """Put the report of an edge in us whose clients send `rates` (msg/s by region) to each partition
    into the cluster's edges bucket (it lives cluster.layout.EDGE_TTL: put it again before each use)."""

    async def put() -> None:
        urls = recorded_nats_urls(cluster.data_dir)
        assert urls is not None
        nc = await connect(urls, *read_credentials(credentials_path(cluster.data_dir)), name="test-edge")
        try:
            js = nc.jetstream()
            layout = await read_layout(js)
            assert layout is not None
            report = EdgeReport(
                US_EDGE,
                "us",
                "us-1",
                "https://127.0.0.1:9",
                time.time(),
                10.0,
                {p: PartitionTraffic(r, 100, 80.0, 95.0, "") for p, r in rates.items()},
                {name: NodeLatency(region, RTT_FROM_US[region]) for name, region in REGIONS.items()},
            )
            edges = await js.key_value(layout.edges_bucket)
            await edges.put(US_EDGE, report.to_json())
        finally:
            await nc.close()

    asyncio.run(put())


REGIONS = {"n1": "eu", "n2": "us", "n3": "ap"}  # cluster up --regions eu,us,ap


def owned_in(data: dict[str, Any], region: str) -> int:
    """A partition owned in `region` (the first)."""
    return next(p["partition"] for p in data["partitions"] if p["region"] == region)


# ------------------------------------------------------------------------------------ options
def test_help_explains_each_option() -> None:
    placement = run("cluster", "placement", "--help")
    for flag in (
        "--off", "--traffic", "--schedule", "--day-seconds", "--day-origin", "--hold", "--cooldown",
        "--max-moves-per-hour", "--min-share", "--min-saving-ms", "--min-rate", "--json",
    ):  # fmt: skip
        assert flag in ok(placement), flag
    assert "default: 300" in placement.stdout and "00:00=ap,08:00=eu,16:00=us" in placement.stdout
    plan = ok(run("cluster", "plan", "--help"))
    for flag in ("--apply", "--by", "--wait", "--json", "default: 60"):
        assert flag in plan, flag
    assert "--regions" in ok(run("cluster", "up", "--help"))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("placement", "--hold", "abc"), ("--hold", "'abc' is not a number")),
        (("placement", "--hold", "-1"), ("--hold must be",)),
        (("placement", "--cooldown", "nan"), ("--cooldown must be",)),
        (("placement", "--min-share", "1.5"), ("--min-share must be 0-1",)),
        (("placement", "--max-moves-per-hour", "1.5"), ("--max-moves-per-hour", "whole number")),
        (("placement", "--day-seconds", "0"), ("--day-seconds must be",)),
        (("placement", "--schedule", "25:00=eu"), ("--schedule", "25:00=eu", "00:00-23:59")),
        (("placement", "--schedule", "08:00"), ("--schedule", "HH:MM=REGION")),
        (("placement", "--schedule", "08:00=e u"), ("--schedule", "region")),
        (("placement", "--schedule", "08:00=eu,08:00=us"), ("--schedule", "two steps at 08:00")),
        (("plan", "--wait", "0"), ("--wait must be more than 0",)),
        (("plan", "--wait", "soon"), ("--wait", "not a number")),
    ],
)
def test_bad_values_are_one_line_exit_2(
    tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    # A dir without a cluster: a value checked only after connecting would say "no cluster" (exit 1).
    one_line(run("cluster", *args, "--data-dir", str(tmp_path)), 2, *words)


@pytest.mark.parametrize("regions", ["eu,,us", "eu,eu", "e/u"])
def test_up_refuses_bad_regions_before_starting_anything(tmp_path: Path, regions: str) -> None:
    one_line(run("cluster", "up", "--regions", regions, "--data-dir", str(tmp_path / "c")), 2, "--regions")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "command", [("placement",), ("placement", "--traffic"), ("plan",), ("plan", "--apply")]
)
def test_no_cluster_is_one_line_exit_1(tmp_path: Path, command: tuple[str, ...]) -> None:
    one_line(run("cluster", *command, "--data-dir", str(tmp_path)), 1, "no cluster in", str(tmp_path))


def test_plan_without_edge_reports_says_so(tmp_path: Path) -> None:
    """A cluster's layout and buckets on a real JetStream server, no queue server and no edge yet."""
    with running_nats(tmp_path / "n", 1) as nats:

        async def create() -> None:
            nc = await connect(nats.client_urls, *nats.credentials, name="test-layout")
            try:
                layout = await ensure_layout(nc.jetstream(), 2, 1)
                await ensure_streams(nc.jetstream(), layout)
            finally:
                await nc.close()

        asyncio.run(create())
        where = ("--data-dir", str(tmp_path / "n"))
        done = run("cluster", "plan", *where)
        assert ok(done).strip() == "strictq: no traffic measured yet: edges report every second"
        data = json.loads(ok(run("cluster", "plan", "--json", *where)))
        assert data["mode"] == "traffic" and data["proposals"] == []
        text = ok(run("cluster", "status", *where))
        assert "placement: off" in text and "no edge has reported" in text
        assert json.loads(ok(run("cluster", "status", "--json", *where)))["edges"] == []
        schedule = run("cluster", "plan", "--by", "schedule", *where)
        one_line(schedule, 2, "no schedule to plan by")


# ------------------------------------------------------------------------------- a real cluster
def test_up_gives_the_nodes_their_regions_and_status_shows_the_geography(cluster: Cluster) -> None:
    data = status(cluster)
    assert {n["node"]: (n["region"], n["zone"]) for n in data["nodes"]} == {
        name: (region, f"{region}-1") for name, region in REGIONS.items()
    }
    for partition in data["partitions"]:
        assert partition["region"] == REGIONS[partition["owner"]]
    assert data["placement"]["mode"] == "off"

    def gateway_reported() -> dict[str, Any] | None:
        edges = status(cluster)["edges"]
        return next((e for e in edges if e["url"] == cluster.url), None)

    edge = until_sync(gateway_reported, within=30, what="the gateway's report in the edges bucket")
    assert edge["region"] is None  # cluster up's gateway has no region of its own
    assert set(edge["nodes"]) == set(REGIONS)  # it probes every node
    text = ok(cli(cluster, "status"))
    assert re.search(r"^PARTITION\s+OWNER\s+REGION\s+EPOCH", text, re.M)
    assert re.search(r"^EDGE\s+REGION\s+ZONE\s+URL\s+SENDS/S", text, re.M)
    assert re.search(rf"^{edge['edge']}\s+-\s+-\s+{re.escape(cluster.url)}\s", text, re.M)
    assert "placement: off" in text


def test_placement_is_set_and_read_back(cluster: Cluster) -> None:
    text = ok(cli(cluster, "placement", "--traffic", "--hold", "3600", "--min-share", "0.6"))
    assert text.startswith("placement: by traffic") and "hold 3600s" in text and ">= 60%" in text
    data = json.loads(ok(cli(cluster, "placement", "--json")))
    assert (data["mode"], data["hold"], data["min_share"]) == ("traffic", 3600.0, 0.6)
    assert (data["cooldown"], data["max_moves_per_hour"], data["min_saving_ms"]) == (900.0, 12, 5.0)

    before = time.time()
    schedule = ("--schedule", "16:00=ap,00:00=eu,08:00=us", "--day-seconds", "24")
    data = json.loads(ok(cli(cluster, "placement", *schedule, "--json")))
    assert data["mode"] == "schedule" and data["schedule_text"] == "00:00=eu,08:00=us,16:00=ap"
    assert data["day_seconds"] == 24.0 and before - 1 <= data["day_origin"] <= time.time()  # starts now
    assert data["hold"] == 3600.0  # the others kept
    status_text = ok(cli(cluster, "status"))
    assert "placement: by schedule 00:00=eu,08:00=us,16:00=ap over a 24s day" in status_text
    assert status(cluster)["placement"]["schedule_text"] == "00:00=eu,08:00=us,16:00=ap"

    data = json.loads(
        ok(cli(cluster, "placement", "--day-seconds", "86400", "--day-origin", "3600", "--json"))
    )
    assert (data["day_seconds"], data["day_origin"]) == (86400.0, 3600.0)
    # Traffic again (a schedule kept for later), with a hold the master will not reach during the tests:
    # only `plan` moves anything below.
    data = json.loads(ok(cli(cluster, "placement", "--traffic", "--json")))
    assert data["mode"] == "traffic" and data["schedule_text"] == "00:00=eu,08:00=us,16:00=ap"


def test_plan_without_traffic_from_a_known_region_proposes_nothing(cluster: Cluster) -> None:
    ok(cli(cluster, "placement", "--traffic", "--hold", "3600"))
    done = cli(cluster, "plan")
    assert "strictq: no moves" in ok(done) and "no sends from a known client region" in done.stdout
    assert json.loads(ok(cli(cluster, "plan", "--json")))["proposals"] == []


def test_plan_shows_and_applies_the_move_toward_the_traffic(cluster: Cluster) -> None:
    ok(cli(cluster, "placement", "--traffic", "--hold", "3600", "--max-moves-per-hour", "12"))
    until_sync(lambda: settled(status(cluster)), within=60, what="a settled cluster")
    data = status(cluster)
    moving = owned_in(data, "eu")  # owned by n1: its senders are in us
    put_report(cluster, {moving: {"us": 20.0}})

    text = ok(cli(cluster, "plan"))
    header, *rows = text.strip().splitlines()
    assert header.split()[:4] == ["PARTITION", "FROM", "TO", "WHY"] and header.rstrip().endswith("STATUS")
    assert len(rows) == 1, text
    row = rows[0]
    assert row.startswith(f"{moving}  ") and "n1 (eu)" in row and "n2 (us)" in row, row
    assert "100% of 20.0 msg/s from us" in row and "79 ms" in row, row
    assert "target 0 frames behind" in row and row.rstrip().endswith("ready"), row

    put_report(cluster, {moving: {"us": 20.0}})
    (proposal,) = json.loads(ok(cli(cluster, "plan", "--json")))["proposals"]
    assert proposal["partition"] == moving
    assert (proposal["from_node"], proposal["to_node"]) == ("n1", "n2")
    assert (proposal["from_region"], proposal["to_region"]) == ("eu", "us")
    assert proposal["saved_ms"] == pytest.approx(79.0) and proposal["status"] == "ready"

    put_report(cluster, {moving: {"us": 20.0}})
    seen = status(cluster)
    assert seen["partitions"][moving]["traffic"]["top_region"] == "us"
    assert seen["partitions"][moving]["traffic"]["top_share"] == 1.0
    assert any(e["edge"] == US_EDGE and e["sends_per_s"] == 20.0 for e in seen["edges"])
    assert re.search(rf"^{moving}\s+n1\s+eu\s.*\bus 100% of 20\.0/s$", ok(cli(cluster, "status")), re.M)

    put_report(cluster, {moving: {"us": 20.0}})
    done = cli(cluster, "plan", "--apply", "--wait", "60")
    assert re.search(
        rf"^strictq: partition {moving} moved to n2 \(epoch \d+\) in \d+\.\d\ds$", ok(done), re.M
    )
    after = status(cluster)["partitions"][moving]
    assert (after["owner"], after["region"]) == ("n2", "us")
    assert "1 move in the last hour" in ok(cli(cluster, "placement"))

    # Now where its senders are: nothing to do for it.
    put_report(cluster, {moving: {"us": 20.0}})
    assert "strictq: no moves" in ok(cli(cluster, "plan"))


def test_plan_shows_why_a_move_waits(cluster: Cluster) -> None:
    ok(cli(cluster, "placement", "--traffic", "--hold", "3600", "--max-moves-per-hour", "0"))
    until_sync(lambda: settled(status(cluster)), within=60, what="a settled cluster")
    partition = owned_in(status(cluster), "ap")
    put_report(cluster, {partition: {"us": 5.0}})
    (proposal,) = json.loads(ok(cli(cluster, "plan", "--json")))["proposals"]
    assert proposal["partition"] == partition and proposal["to_region"] == "us"
    assert proposal["blocked"].startswith("budget:") and proposal["status"] == proposal["blocked"]
    put_report(cluster, {partition: {"us": 5.0}})
    done = cli(cluster, "plan", "--apply")  # nothing ready: nothing written, nothing waited for
    assert "budget:" in ok(done) and "moved" not in done.stdout
    assert status(cluster)["partitions"][partition]["moving_to"] is None
    ok(cli(cluster, "placement", "--off", "--max-moves-per-hour", "12"))


def test_a_plan_applied_with_placement_off_is_not_undone_by_rebalancing(cluster: Cluster) -> None:
    """Rebalancing evens out ownership by count; after an operator's `plan --apply`, as after `cluster
    move`, it waits (cluster.master's operator quiet), or it would move partitions straight back."""
    ok(cli(cluster, "placement", "--off"))
    until_sync(lambda: settled(status(cluster)), within=60, what="a settled cluster")
    partition = owned_in(status(cluster), "ap")
    put_report(cluster, {partition: {"us": 20.0}})
    done = cli(cluster, "plan", "--apply", "--wait", "60")
    assert f"strictq: partition {partition} moved to n2" in ok(done)
    owners = {p["partition"]: p["owner"] for p in status(cluster)["partitions"]}
    assert owners[partition] == "n2" and "n3" not in owners.values()  # uneven: rebalancing would move
    for _ in range(5):  # a few looks (each a CLI run), where the master ticks every 0.2 s
        data = status(cluster)
        assert {p["partition"]: p["owner"] for p in data["partitions"]} == owners
        assert all(p["moving_to"] is None for p in data["partitions"]), data["partitions"]
