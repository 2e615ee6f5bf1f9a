"""Reading /proc: CPU time of a process and of its threads, resident memory, machine facts."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_cpu(path: Path) -> float:
    """utime + stime in seconds from a /proc/.../stat file (fields 14 and 15)."""
    text = path.read_text()
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


@dataclass(frozen=True, slots=True)
class CpuSample:
    at: float  # time.monotonic()
    total: float  # process CPU seconds, all threads
    main: float  # the main thread (the event loop)

    @property
    def other(self) -> float:
        """Every other thread: for the queue server, the SQLite writer thread."""
        return self.total - self.main


def cpu_sample(pid: int) -> CpuSample:
    total = cpu_seconds(pid)
    try:
        main = _stat_cpu(Path(f"/proc/{pid}/task/{pid}/stat"))
    except OSError:
        main = total
    return CpuSample(time.monotonic(), total, main)


def rss_bytes(pid: int) -> int:
    """VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def machine_facts() -> dict[str, str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
            break
    return {
        "nproc": str(os.cpu_count()),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "cpu": model,
        "python": sys.version.split()[0] + f" ({platform.python_implementation()})",
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
