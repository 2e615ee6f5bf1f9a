"""`python -m bench.cluster_cpu [--runs N] [--duration S]`: the cluster's servers' CPU per message, alone.

Issue 28's yardstick for the data path: the gw-emodb load (bench.cluster_bench's: EmoDB face, batch 10,
100 groups) through `strictq cluster up --nodes 3 --replicas 3 --partitions 3`, each run's CPU seconds per
process from /proc (bench.procstat) divided by the messages acknowledged end to end, and the frames the
partitions' streams took meanwhile (messages per frame). The machine is shared, so rates are noisy; CPU
per message and frames per message are what a before/after comparison reads. Prints one JSON line per run
and the medians; starts and stops everything itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .cluster_bench import ClusterServer, CpuWindow, cluster_args, role_cores, wait_settled
from .harness import run_load
from .scenarios import Settings, _gateway_spec
from .servers import export_internal_secret

ROOT = Path(__file__).resolve().parent.parent


def stream_frames(cluster: ClusterServer) -> int:
    """Frames in every partition's stream now (the last sequence, summed: trims do not lower it)."""
    return sum(int(p.get("last_seq") or 0) for p in cluster.status()["partitions"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0.0, help="open loop at this many msg/s (0: closed)")
    parser.add_argument("--pyspy", action="store_true", help="one more run under py-spy (bench/out)")
    args = parser.parse_args(argv)
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="strictq-cpu-"))
    export_internal_secret(work_dir)
    st = Settings(
        quick=False, duration=args.duration, warmup=args.warmup, backlog=0, core_messages=0, procs=2,
        producers=8, consumers=16, cap=5000, work_dir=work_dir, out_dir=out_dir, profile=False,
    )  # fmt: skip
    cluster = ClusterServer(
        work_dir / "c", out_dir / "cluster-cpu.log", extra_args=cluster_args(args.replicas, 3)
    )
    rows: list[dict[str, Any]] = []
    try:
        cluster.start(180.0)
        ok, _ = wait_settled(cluster, ["n1", "n2", "n3"])
        print(f"cluster ready; {'balanced' if ok else 'NOT balanced'}", flush=True)
        spec = _gateway_spec(st, "emodb", cluster)
        if args.rate:
            spec = replace(spec, mode="open", rate=args.rate / st.procs)
        pids = cluster.processes()
        for _ in range(args.runs):
            window = CpuWindow(dict(pids))
            frames_before = stream_frames(cluster)
            started = time.monotonic()
            summary = run_load(spec, st.procs, pids.get("gateway"), on_window=window.open)
            frames = stream_frames(cluster) - frames_before
            cpu = window.cores(summary.duration)
            acked = summary.acked or 1
            per = {name: round(1e6 * c["total"] * summary.duration / acked) for name, c in cpu.items()}
            roles = {k: round(1e6 * v * summary.duration / acked) for k, v in role_cores(cpu).items()}
            row = {
                "msg_s": round(summary.ack_rate),
                "servers_us": sum(roles.values()),
                "roles_us": roles,
                "per_process_us": per,
                # frames over the whole run (warm-up and tail included): messages per frame is approximate
                "frames": frames,
                "sent": summary.sent,
                "wall": round(time.monotonic() - started, 1),
                "errors": summary.errors,
                "machine_busy": round(window.busy(), 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.pyspy:
            seconds = str(int(args.duration + args.warmup))
            spies = [
                subprocess.Popen(
                    [str(ROOT / ".venv" / "bin" / "py-spy"), "record", "--pid", str(pid), "--duration",
                     seconds, "--format", "raw", "--rate", "50", "--nonblocking",
                     "--output", str(out_dir / f"cpu-{name.replace(' ', '-')}.pyspy.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                for name, pid in pids.items()
                if name.startswith("node") or name == "gateway"
            ]  # fmt: skip
            run_load(spec, st.procs, pids.get("gateway"))
            for spy in spies:
                spy.wait(60)
    finally:
        cluster.stop()
    if rows:
        median = {
            "msg_s": statistics.median(r["msg_s"] for r in rows),
            "servers_us": statistics.median(r["servers_us"] for r in rows),
            **{
                f"{k}_us": statistics.median(r["roles_us"][k] for r in rows)
                for k in ("gateway", "queue servers", "nats-servers")
            },
        }
        print("median " + json.dumps(median), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
