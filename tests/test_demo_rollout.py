"""`strictq demo --rollout --fast`: the canary rollouts demo runs to its summary and exits 0 (issue 18).

As a user would: the failover scenario's system (`strictq serve`, its egress proxy, a fake backend, a
producer, two workers of version 1.0), then `strictq rollout start` three times: version 1.1 (a bad deploy)
reverted by the live gate on its failures, version 2.0 (it charges in euros) reverted by the replay gate
before any live order reaches it, version 1.2 completed through every step; each step an event in
`strictq status`; nothing lost, every group in order.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xdist_group("demo-rollout"), pytest.mark.timeout(420)]
DEMO_TIMEOUT = 400.0


def test_the_rollout_demo_reverts_two_versions_and_completes_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "strictq", "demo", "--rollout", "--fast", "--data-dir", str(data_dir)],
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
        "the system: strictq serve, a backend, a producer and version 1.0",
        "rollout of 1.1: a bad deploy, reverted by the live gate",
        "rollout of 2.0: a changed request, reverted by the replay gate",
        "rollout of 1.2: replay matches, every step passes, completed",
        "draining",
        "the events (strictq status)",
        "summary",
    ], out
    bad, diverging, good = re.split(r"^== \d+\. rollout of ", out, flags=re.MULTILINE)[1:4]
    assert re.search(r"REVERTED: (canary failure rate \d|\d+ canary worker\(s\) fenced)", bad), bad
    assert "step 1/2 25%: REVERTED: replay diverged on" in diverging and "passed:" not in diverging
    assert re.search(r"replay of \d+ recorded message\(s\) of \d+ group\(s\): 0 diverged", good), good
    assert good.count("passed:") == 2 and "rollout of 1.2 completed: every group goes to 1.2" in good
    for event in ("rollout-running", "rollout-reverted", "rollout-completed"):
        assert event in out, event  # strictq status's latest events
    assert "rollouts: 1.1 reverted, 2.0 reverted, 1.2 completed" in out
    assert re.search(r"^sent (\d+) · charged \1 · lost 0 · order violations 0 · charged twice 0$", out, re.M)
