"""`strictq demo --no-spark --fast`: the reduced demo (no Spark) runs to its summary and exits 0.

The full demo (`make demo`) also indexes the wire log with Spark and searches it; that part stays out of
CI (the Spark jobs have their own tests). This runs everything else as a user would: the failover
scenario against `strictq serve`, `strictq status` while it runs, and `strictq replay` of a changed
worker version (version 2 charges in euros, so every replayed call's body differs from the recording).

`demo` lives in the scenarios package, above strictq: the CLI finds it through the `strictq.commands`
entry-point group (pyproject.toml) and never imports it. The last tests check that discovery with the
installed entry point and with stand-in add-on distributions (one that works, one that cannot load).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO_TIMEOUT = 150.0
CLI_TIMEOUT = 60.0


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


def strictq(*argv: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m strictq ARGV`, with `path` (stand-in distributions) first on the import path."""
    env = {**os.environ}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "strictq", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env,
    )


def test_demo_is_a_command_the_cli_finds_by_its_entry_point() -> None:
    listed = strictq("--help")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert re.search(r"^\s+demo\s+run the whole system", listed.stdout, re.M), listed.stdout
    own = strictq("demo", "--help")
    assert own.returncode == 0, own.stderr
    assert own.stdout.startswith("usage: strictq demo") and "--no-spark" in own.stdout, own.stdout


def test_an_add_on_command_runs_and_a_broken_one_is_left_out_in_one_line(tmp_path: Path) -> None:
    """Two stand-in distributions declare `strictq.commands`: `hello` works; `broken` names a module that
    does not exist. Every other command keeps working, the broken one is named on one line of stderr."""
    _distribution(tmp_path, "hello-addon", "hello = hello_addon:register")
    (tmp_path / "hello_addon.py").write_text(
        "def register(commands):\n"
        "    hello = commands.add_parser('hello', help='a stand-in add-on command')\n"
        "    hello.set_defaults(handler=lambda args: print('hello from an add-on') or 3)\n"
    )
    _distribution(tmp_path, "broken-addon", "broken = no_such_addon_module:register")

    ran = strictq("hello", path=tmp_path)
    assert (ran.returncode, ran.stdout) == (3, "hello from an add-on\n"), ran.stdout + ran.stderr
    listed = strictq("--help", path=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^\s+hello\s+a stand-in add-on command", listed.stdout, re.M), listed.stdout
    assert re.search(r"^\s+demo\s", listed.stdout, re.M), listed.stdout
    assert "Traceback" not in listed.stderr
    [line] = listed.stderr.splitlines()
    assert line.startswith("strictq: command 'broken' (no_such_addon_module:register) is unavailable"), line


def _distribution(where: Path, name: str, entry: str) -> None:
    """An installed distribution's metadata, as importlib.metadata finds it on the path."""
    info = where / f"{name.replace('-', '_')}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[strictq.commands]\n{entry}\n")
