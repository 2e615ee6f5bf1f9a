"""Parent side of a load run: spawn the generator processes, start them together, sample CPU, aggregate."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .loadgen import LoadResult, LoadSpec, worker_entry
from .procstat import CpuSample, cpu_sample, machine_cpu


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class LoadSummary:
    procs: int
    duration: float
    sent: int = 0
    received: int = 0
    acked: int = 0
    send_requests: int = 0
    receive_requests: int = 0
    empty_receives: int = 0
    ack_requests: int = 0
    errors: int = 0
    dropped: int = 0
    sign_ns: int = 0  # SQS face: generator time spent SigV4-signing, and how many requests it signed
    signs: int = 0
    first_errors: list[str] = field(default_factory=list)
    # Every repeat when this summary is the median of several: (end-to-end rate, other CPU in cores,
    # server CPU µs per message).
    runs: list[tuple[float, float, float]] = field(default_factory=list)
    generator_cpu: float = 0.0  # CPU seconds of all generator processes in the window
    server_cpu: float = 0.0  # CPU seconds of the server process in the window
    server_main_cpu: float = 0.0  # its main thread (event loop)
    server_other_cpu: float = 0.0  # its other threads (the SQLite writer)
    machine_busy: float = 0.0  # fraction of all cores busy in the window
    send_latency: list[float] = field(default_factory=list, repr=False)
    receive_ack_latency: list[float] = field(default_factory=list, repr=False)
    delivery_latency: list[float] = field(default_factory=list, repr=False)

    # Rates are per second of the measurement window.
    @property
    def send_rate(self) -> float:
        return self.sent / self.duration

    @property
    def receive_rate(self) -> float:
        return self.received / self.duration

    @property
    def ack_rate(self) -> float:
        return self.acked / self.duration

    @property
    def other_cores(self) -> float:
        """CPU busy on the machine outside the server and the generators (someone else's work)."""
        return max(0.0, self.machine_busy * (os.cpu_count() or 1) - self.server_cores - self.generator_cores)

    @property
    def server_cores(self) -> float:
        return self.server_cpu / self.duration

    @property
    def generator_cores(self) -> float:
        return self.generator_cpu / self.duration

    def server_us_per_message(self) -> float:
        """Server CPU per message that went all the way through (send + receive + ack)."""
        return 1e6 * self.server_cpu / self.acked if self.acked else float("nan")

    @property
    def sign_us(self) -> float:
        """Generator µs per SigV4 signature (SQS face)."""
        return self.sign_ns / 1000.0 / self.signs if self.signs else float("nan")

    def latency_ms(self, which: str, q: float) -> float:
        return 1000.0 * percentile(getattr(self, which), q)

    def brief(self) -> dict[str, Any]:
        out = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("send_latency", "receive_ack_latency", "delivery_latency")
        }
        out.update(
            send_rate=self.send_rate,
            receive_rate=self.receive_rate,
            ack_rate=self.ack_rate,
            server_cores=self.server_cores,
            generator_cores=self.generator_cores,
            other_cores=self.other_cores,
            server_us_per_message=self.server_us_per_message(),
            sign_us=self.sign_us,
        )
        for which in ("send_latency", "receive_ack_latency", "delivery_latency"):
            samples = getattr(self, which)
            if samples:
                out[which] = {
                    "n": len(samples),
                    "p50_ms": self.latency_ms(which, 50),
                    "p99_ms": self.latency_ms(which, 99),
                    "max_ms": 1000.0 * max(samples),
                }
        return out


def run_load(
    spec: LoadSpec,
    procs: int,
    server_pid: int | None,
    on_window: Callable[[float], None] | None = None,
) -> LoadSummary:
    """Run `procs` generator processes with `spec` (open-loop rate split between them).

    `on_window(seconds)` is called when the measurement window opens (e.g. to start a profiler).
    """
    ctx = mp.get_context("spawn")
    workers: list[tuple[Any, Any]] = []
    try:
        for index in range(procs):
            parent_end, child_end = ctx.Pipe()
            share = replace(spec, index=index, rate=spec.rate / procs if spec.rate else 0.0)
            proc = ctx.Process(target=worker_entry, args=(asdict(share), child_end), daemon=True)
            proc.start()
            child_end.close()
            workers.append((proc, parent_end))
        for proc, conn in workers:
            if not conn.poll(60):
                raise RuntimeError(f"load generator {proc.pid} did not get ready")
            conn.recv()
        start_at = time.time() + 0.3
        for _, conn in workers:
            conn.send(start_at)
        # Sample the server's CPU over the same window the generators count in.
        window_start = start_at + spec.warmup
        window_end = window_start + spec.duration
        time.sleep(max(0.0, window_start - time.time()))
        cpu0: CpuSample | None = cpu_sample(server_pid) if server_pid else None
        machine0 = machine_cpu()
        if on_window is not None:
            on_window(spec.duration)
        time.sleep(max(0.0, window_end - time.time()))
        cpu1: CpuSample | None = cpu_sample(server_pid) if server_pid else None
        machine1 = machine_cpu()
        results: list[LoadResult] = []
        for proc, conn in workers:
            if not conn.poll(spec.wait + 30):
                raise RuntimeError(f"load generator {proc.pid} sent no result")
            status, payload = conn.recv()
            if status != "ok":
                raise RuntimeError(f"load generator {proc.pid} failed: {payload}")
            results.append(LoadResult(**payload))
    finally:
        for proc, conn in workers:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            conn.close()
    summary = LoadSummary(procs=procs, duration=spec.duration)
    for result in results:
        for name in (
            "sent",
            "received",
            "acked",
            "send_requests",
            "receive_requests",
            "empty_receives",
            "ack_requests",
            "errors",
            "dropped",
            "sign_ns",
            "signs",
        ):
            setattr(summary, name, getattr(summary, name) + getattr(result, name))
        summary.first_errors += result.first_errors
        summary.generator_cpu += result.cpu_seconds
        summary.send_latency += result.send_latency
        summary.receive_ack_latency += result.receive_ack_latency
        summary.delivery_latency += result.delivery_latency
    if cpu0 is not None and cpu1 is not None:
        summary.server_cpu = cpu1.total - cpu0.total
        summary.server_main_cpu = cpu1.main - cpu0.main
        summary.server_other_cpu = cpu1.other - cpu0.other
    busy = machine1[0] - machine0[0]
    total = machine1[1] - machine0[1]
    summary.machine_busy = busy / total if total else 0.0
    return summary
