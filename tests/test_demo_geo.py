"""`strictq demo --geo --fast`: the regions demo (scenarios/geo_demo.py) runs to its summary and exits 0.

It runs as a user would, as a subprocess: a simulated world of three regions (strictq.geo_sim), a producer
in us whose partition is moved to eu, `strictq cluster plan`, placement by traffic moving it to us, the
latency measured before and after, follow-the-sun over a compressed day, and every message received in
order. The figures are not asserted (the machine is shared); the story's steps and the counts are.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xdist_group("geo"), pytest.mark.timeout(400)]
DEMO_TIMEOUT = 360.0


def test_the_geo_demo_runs_to_its_summary(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "strictq", "demo", "--geo", "--fast", "--data-dir", str(data_dir)],
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
        "the world: three regions on one machine",
        "a producer in us, its group owned in eu",
        "what placement would do: strictq cluster plan",
        "placement by traffic, turned on",
        "the same producer, measured again",
        "follow the sun over a compressed day",
        "every message, in order",
        "summary",
    ], out
    assert "link eu<->us: 40 ms one way, 80 ms round trip" in out, out
    assert "strictq: partition 0 moved to eu" in out, out  # the operator's move before the measurement
    # The plan proposed moving partition 0 from eu to us, ready to be made.
    assert re.search(r"^  0\s+eu \(eu\)\s+us \(us\)\s.*\bready$", out, re.MULTILINE), out
    assert re.search(r"partition 0 is owned in us [0-9.]+ s after placement was turned on", out), out
    counts = r"^sent (\d+) · received (\d+) · lost 0 · order violations 0 · duplicates \d+"
    sent = re.search(counts, out, re.M)
    assert sent is not None and int(sent[1]) > 0 and int(sent[2]) >= int(sent[1]), out
    assert re.search(
        r"^send latency from us to orders-\d+: p50 \d+ ms / p99 \d+ ms owned in eu, "
        r"p50 \d+ ms / p99 \d+ ms owned in us \([0-9.]+x faster;",
        out,
        re.M,
    ), out
    sun = r"^follow the sun: partition 1 owned in .*eu -> us -> ap -> eu over a 30 s day; \d+ moves"
    assert re.search(sun, out, re.M), out
    assert (data_dir / "world" / "logs").is_dir() and (data_dir / "demo.log").is_file()
