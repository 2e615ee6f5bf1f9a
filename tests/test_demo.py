"""`strictq demo --no-spark --fast`: the reduced demo (no Spark) runs to its summary and exits 0.

The full demo (`make demo`) also indexes the wire log with Spark and searches it; that part stays out of
CI (the Spark jobs have their own tests). This runs everything else as a user would: the failover
scenario against `strictq serve`, `strictq status` while it runs, and `strictq replay` of a changed
worker version (version 2 charges in euros, so every replayed call's body differs from the recording).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO_TIMEOUT = 150.0


def test_the_reduced_demo_runs_to_its_summary(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "strictq",
            "demo",
            "--no-spark",
            "--fast",
            "--workers",
            "3",
            "--data-dir",
            str(data_dir),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    sections = re.findall(r"^== \d+\. (.+)$", out, re.MULTILINE)
    assert sections == [
        "the system: strictq serve, a backend, a producer and workers",
        "a faulty worker: worker-3",
        "a backend outage",
        "draining",
        "replaying a changed worker version",
        "summary",
    ], out
    assert re.search(
        r"^sent (\d+) · acked \1 · lost 0 · order violations 0 · processed twice 0$", out, re.M
    ), out
    assert "event fence         worker-3" in out and "event unfence       worker-3" in out
    assert "event suspend       orders" in out and "event resume        orders" in out
    assert "no worker was fenced for the outage" in out
    assert "$ strictq status" in out and "fenced" in out  # strictq status while worker-3 was fenced
    assert '+  "currency": "EUR",' in out  # the replay's diff of version 2
    assert (data_dir / "replay" / "report.json").is_file()
    assert (data_dir / "system" / "wirelog").is_dir() and (data_dir / "demo.log").is_file()
