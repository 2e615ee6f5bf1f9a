"""Where the server's time goes under load.

Preferred: py-spy (if installed: `pip install py-spy`; not a project dependency) attached to the running
server for the measurement window, sampling every thread with native frames and idle samples, so the
breakdown is of wall-clock time per thread (event loop and SQLite writer) at ~no cost to the server.
Fallback: pyinstrument (the `bench` extra) running the server, main thread only, with high overhead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RATE = 100  # samples per second (native unwinding pauses the server: keep it modest)

# (category, test on the sample) for the event-loop thread, first match wins.
LOOP_ORDER = [
    "idle: waiting in epoll",
    "waiting for the GIL",
    "garbage collection",
    "socket syscalls (read/write)",
    "SQLite reads on the loop (bodies)",
    "core state machine (queue_core.machine)",
    "service shell (queue_core.service)",
    "durable-log hand-off (queue_core.durability)",
    "HTTP handlers (queue_core.server)",
    "TLS (ssl: encrypt/decrypt)",
    "SigV4 verification (gateway.sqs_auth, botocore)",
    "gateway faces (gateway.*)",
    "orjson",
    "aiohttp (parsing, routing, responses)",
    "event loop, futures, tasks (asyncio/uvloop)",
    "other",
]
WRITER_ORDER = [
    "waiting for work (queue empty)",
    "fsync (fdatasync/fsync)",
    "waiting for the GIL",
    "SQLite work (sqlite3_*)",
    "Python (rows, batches, bookkeeping)",
    "other",
]


def pyspy_binary() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start_pyspy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    binary = pyspy_binary()
    assert binary is not None
    return subprocess.Popen(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            str(RATE),
            "--format",
            "raw",
            "--threads",
            "--native",
            "--idle",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _python_frames(frames: list[str]) -> list[str]:
    return [f for f in frames if ".py:" in f or "<string>:" in f or "<frozen" in f]


def _native_after_python(frames: list[str]) -> list[str]:
    last = max((i for i, f in enumerate(frames) if ".py:" in f), default=-1)
    return frames[last + 1 :]


def _function(frame: str) -> str:
    """`name (file.py:123)` -> `name (file.py)`: aggregate a function's lines."""
    name, _, where = frame.partition(" (")
    if name == "Runner.run":  # nothing Python below it: uvloop's own C code (I/O, callbacks, timers)
        return "uvloop internals, C (under Runner.run)"
    return f"{name} ({where.rsplit(':', 1)[0].rstrip(')')})" if where else name


def classify_loop(frames: list[str]) -> str:
    leaf = frames[-1]
    native = " ".join(_native_after_python(frames))
    if "epoll_wait" in leaf or "epoll_pwait" in leaf:
        return "idle: waiting in epoll"
    if "take_gil" in native or "pthread_cond_timedwait" in native:
        return "waiting for the GIL"
    if any("gc_collect" in f for f in frames):
        return "garbage collection"
    if leaf.split(" (")[0] in (
        "write",
        "writev",
        "read",
        "recv",
        "send",
        "sendmsg",
        "recvmsg",
        "__send",
        "__recv",
    ):
        return "socket syscalls (read/write)"
    python = _python_frames(frames)
    deepest = python[-1] if python else ""
    if "orjson" in native or (deepest.startswith(("dumps ", "loads ")) and "built-in" in deepest):
        return "orjson"
    for frame in reversed(python):
        if "queue_core/store.py" in frame:
            return "SQLite reads on the loop (bodies)"
        if "queue_core/machine/" in frame:
            return "core state machine (queue_core.machine)"
        if "queue_core/service.py" in frame:
            return "service shell (queue_core.service)"
        if "queue_core/durability.py" in frame:
            return "durable-log hand-off (queue_core.durability)"
        if "queue_core/server.py" in frame:
            return "HTTP handlers (queue_core.server)"
        if "ssl.py:" in frame or "sslproto" in frame:
            return "TLS (ssl: encrypt/decrypt)"
        if "gateway/sqs_auth.py" in frame or "botocore/" in frame:
            return "SigV4 verification (gateway.sqs_auth, botocore)"
        if "gateway/" in frame:
            return "gateway faces (gateway.*)"
        if "aiohttp/" in frame or "multidict" in frame or "yarl/" in frame:
            return "aiohttp (parsing, routing, responses)"
        if "asyncio/" in frame or "uvloop" in frame:
            return "event loop, futures, tasks (asyncio/uvloop)"
    if any("uvloop" in f for f in frames):
        return "event loop, futures, tasks (asyncio/uvloop)"
    return "other"


def classify_writer(frames: list[str]) -> str:
    joined = " ".join(frames)
    native = " ".join(_native_after_python(frames))
    if "SimpleQueue_get" in joined:
        return "waiting for work (queue empty)"
    if "fdatasync" in native or "fsync" in native:
        return "fsync (fdatasync/fsync)"
    if "pthread_cond_timedwait" in native or "take_gil" in native:
        return "waiting for the GIL"
    if "sqlite3" in native:
        return "SQLite work (sqlite3_*)"
    if _python_frames(frames):
        return "Python (rows, batches, bookkeeping)"
    return "other"


def analyze_pyspy(raw: Path) -> dict[str, Any]:
    threads: dict[str, Counter[str]] = {}
    loop_functions: Counter[str] = Counter()
    loop_busy = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        head = frames[0]
        name = head.split(": ", 1)[1] if ": " in head else head
        body = frames[1:] or [head]
        if name == "MainThread":
            kind = "event loop (MainThread)"
            category = classify_loop(body)
            if not category.startswith("idle"):
                loop_busy += n
                python = _python_frames(body)
                if python:
                    loop_functions[_function(python[-1])] += n
        elif "writer" in name:
            kind = f"SQLite writer ({name})"
            category = classify_writer(body)
        else:
            kind = f"other thread ({name})"
            category = "all"
        threads.setdefault(kind, Counter())[category] += n
    return {
        "rate": RATE,
        "threads": {k: dict(v.most_common()) for k, v in threads.items()},
        "loop_busy_samples": loop_busy,
        "loop_functions": loop_functions.most_common(25),
    }


def render_pyspy(analysis: dict[str, Any]) -> str:
    lines: list[str] = []
    threads = sorted(analysis["threads"].items(), key=lambda kv: not kv[0].startswith("event loop"))
    for thread, categories in threads:
        total = sum(categories.values())
        order = LOOP_ORDER if thread.startswith("event loop") else WRITER_ORDER
        ranked = sorted(categories.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
        lines.append(f"**{thread}** — {total:,} samples ({total / analysis['rate']:.1f} s of wall time)\n")
        lines.append("| where | share of wall time |\n|---|---:|")
        for category, n in ranked:
            lines.append(f"| {category} | {100 * n / total:.1f}% |")
        lines.append("")
    busy = analysis["loop_busy_samples"]
    if busy:
        lines.append(
            "Event loop, busy samples by innermost Python function (own time, native callees included):\n"
        )
        lines.append("| function | share of the loop's busy time |\n|---|---:|")
        for function, n in analysis["loop_functions"]:
            lines.append(f"| `{function}` | {100 * n / busy:.1f}% |")
        lines.append("")
    return "\n".join(lines)
