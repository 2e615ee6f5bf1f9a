"""`python -m bench.failover_timeline [--kills N]`: owner kills on a real `strictq cluster up`, each failover
split into its steps from the processes' own log lines (issue 28 item 4).

The cluster is the one `make bench`'s failover figure uses (bench.cluster_bench: `cluster up --nodes 1` at
R3 with three nats-servers, n2 and n3 started by hand, the same light open-loop probe on the EmoDB face),
without the throughput runs before it. For each kill (SIGKILL of the owner of partition k mod 3; the node is
restarted and the cluster left to settle before the next):

- `notice`: kill -> the master writes the partition's new assignment (its `partition P -> N (epoch E)` line);
  of which `proof`: kill -> a node proves the death (cluster.liveness' `N ... is dead` line; none: silence);
- `catch-up`: -> the new owner serves it (its `serves partition P at epoch E` line);
- `gateway`: -> the first acknowledged send to the partition that started after the kill (the client's clock).

Log timestamps are wall-clock milliseconds (wirelog.logsafe's format); everything runs on one machine, so
one clock. Every acknowledged send must come back at the end (0 lost). Results: a table on stdout and
`failover-timeline.json` in the output directory.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster_bench import (
    NODE_START_TIMEOUT,
    PARTITIONS,
    ClusterServer,
    Nodes,
    Probe,
    cluster_args,
    kill_owner,
    until,
    wait_settled,
)
from .servers import export_internal_secret

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
ASSIGNED = re.compile(r"partition (\d+) -> (\S+) \(epoch (\d+)\)")
SERVES = re.compile(r"(\S+) serves partition (\d+) at epoch (\d+) .*promoted in ([0-9.]+)s")
MASTER = re.compile(r"(\S+) is the master")
PROVEN = re.compile(r"(\S+) \(incarnation \S+\) is dead")


@dataclass
class Out:
    """What bench.cluster_bench.Nodes needs of the benchmark's settings."""

    out_dir: Path


def stamped(path: Path) -> list[tuple[float, str]]:
    """(wall-clock time, line) of every timestamped line of a log."""
    lines: list[tuple[float, str]] = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        found = STAMP.match(line)
        if found:
            at = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append((at, line))
    return lines


def every_line(logs: list[Path]) -> list[tuple[float, str]]:
    return sorted(entry for path in logs for entry in stamped(path))


def timeline(lines: list[tuple[float, str]], kill: dict[str, Any]) -> dict[str, Any]:
    """The steps of one failover, from the first matching lines after the kill."""
    killed_at, partition = kill["killed_at"], kill["partition"]
    assigned = serving = proven = None
    promoted = float("nan")
    master_change = False
    for at, line in lines:
        if at < killed_at - 0.002:  # log stamps are truncated to the millisecond
            continue
        if proven is None and (found := PROVEN.search(line)) and found.group(1) == kill["killed"]:
            proven = at
        if MASTER.search(line) and assigned is None:
            master_change = True
        if assigned is None and (found := ASSIGNED.search(line)) and int(found.group(1)) == partition:
            assigned = at
        if (
            assigned is not None
            and serving is None
            and (found := SERVES.search(line))
            and int(found.group(2)) == partition
        ):
            serving, promoted = at, float(found.group(4))
    acked = kill["acked_at"]
    return {
        **kill,
        "master_was_killed": master_change,
        "proof": (proven - killed_at) if proven else float("nan"),
        "notice": (assigned - killed_at) if assigned else float("nan"),
        "catch_up": (serving - assigned) if assigned and serving else float("nan"),
        "promote_s": promoted,
        "gateway": (acked - serving) if serving else float("nan"),
        "total": acked - killed_at,
    }


def summary(values: list[float]) -> str:
    clean = [v for v in values if v == v]
    if not clean:
        return "-"
    return f"median {statistics.median(clean):.2f} max {max(clean):.2f} min {min(clean):.2f}"


async def kills(cluster: ClusterServer, nodes: Nodes, probe: Probe, count: int) -> list[dict[str, Any]]:
    """`count` owner kills under the probe's load; for each, when (wall clock) and what."""
    names = ["n1", "n2", "n3"]
    await until(lambda: any(op.ok for op in probe.ops), 30.0, 0.05)
    offset = time.time() - time.monotonic()
    done: list[dict[str, Any]] = []
    for k in range(count):
        kill = await kill_owner(cluster, nodes, probe, k % PARTITIONS)
        partition, owner, op = kill.partition, kill.owner, kill.first_ok
        took = kill.took
        print(f"kill {k + 1}/{count}: {owner} (p{partition}) -> first acknowledged send after {took:.2f}s")
        done.append(
            {
                "partition": partition,
                "killed": owner,
                "killed_at": kill.killed_at + offset,
                "acked_at": (op.finished if op else float("nan")) + offset,
            }
        )
        await asyncio.to_thread(nodes.start, owner)
        ok, _ = await asyncio.to_thread(wait_settled, cluster, names)
        if not ok:
            print("  the cluster did not settle")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover_timeline", description=__doc__)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench/out/failover-timeline"))
    parser.add_argument("--replay", action="store_true", help="only re-read --out's logs and kills")
    args = parser.parse_args(argv)
    if args.replay:
        saved = json.loads((args.out / "failover-timeline.json").read_text())
        lines = every_line(sorted(args.out.glob("*.log")))
        show([timeline(lines, row) for row in saved["rows"]])
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.log"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="strictq-failover-") as tmp:
        work = Path(tmp)
        export_internal_secret(work)
        cluster = ClusterServer(work / "c", args.out / "cluster-up.log", extra_args=cluster_args(3, 1))
        nodes = Nodes(cluster, Out(args.out), "tl")  # type: ignore[arg-type]
        try:
            cluster.start(180.0)
            for name in ("n2", "n3"):
                nodes.start(name)
            ok, _ = wait_settled(cluster, ["n1", "n2", "n3"], timeout=NODE_START_TIMEOUT)
            print(f"cluster up, 3 queue servers, {'settled' if ok else 'NOT settled'}")
            creds = cluster.credentials()
            producer = next(v["secret"] for v in creds.values() if v["role"] == "producer")
            workers = [v["secret"] for _, v in sorted(creds.items()) if v["role"] == "worker"]
            probe = Probe(cluster.url, cluster.ca, producer, workers)

            async def body(probe: Probe) -> tuple[list[dict[str, Any]], float]:
                done = await kills(cluster, nodes, probe, args.kills)
                return done, await probe.drain(60.0)

            done, drained = asyncio.run(probe.run(body))
        finally:
            nodes.stop()
            cluster.stop()
        for log in (cluster.data_dir / "logs").glob("*.log"):  # kept: the temporary directory goes
            (args.out / f"up-{log.name}").write_bytes(log.read_bytes())
        logs = sorted(args.out.glob("*.log"))
        lines = every_line(logs)
    rows = [timeline(lines, kill) for kill in done]
    show(rows)
    lost = sorted(probe.acked - set(probe.received))
    redelivered = sum(1 for c in probe.received.values() if c > 1)
    print(
        f"drained in {drained:.1f}s: {len(probe.acked)} acknowledged, {len(set(probe.received))} received,"
        f" lost {len(lost)}, delivered more than once {redelivered}; errors {dict(probe.errors)}"
    )
    result = {"rows": rows, "acknowledged": len(probe.acked), "lost": len(lost), "errors": dict(probe.errors)}
    (args.out / "failover-timeline.json").write_text(json.dumps(result, indent=1))
    return 1 if lost else 0


def show(rows: list[dict[str, Any]]) -> None:
    print(f"{'#':>2} {'killed':6} {'p':>1} {'master?':7} {'proof':>6} {'notice':>7} {'catch-up':>8}"
          f" {'(promote)':>9} {'gateway':>7} {'total':>6}")  # fmt: skip
    for i, row in enumerate(rows, 1):
        print(
            f"{i:>2} {row['killed']:6} {row['partition']:>1} {'yes' if row['master_was_killed'] else '':7}"
            f" {row['proof']:6.2f} {row['notice']:7.2f} {row['catch_up']:8.2f} {row['promote_s']:9.2f}"
            f" {row['gateway']:7.2f} {row['total']:6.2f}"
        )
    for key in ("proof", "notice", "catch_up", "gateway", "total"):
        print(f"{key}: {summary([r[key] for r in rows])}")


if __name__ == "__main__":
    raise SystemExit(main())
