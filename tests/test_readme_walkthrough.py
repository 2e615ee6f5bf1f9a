"""README.md's walkthrough, run as written, in order, in one shell (issue 14: "every README block should run
as written in order").

The README's convention: a ```console block holds commands a newcomer types at the checkout, in order, in
one shell (variables and `cd` carry over from block to block). A line starting with `$ ` is a command; a
trailing `\\` continues it on the next line, and a heredoc (`<<'PY'`) runs to its terminator line. The
other lines of the block are what the command prints (ids, times and ports differ from run to run); a line
`...` elides. Blocks with another info string (text, sh, toml, python) are not run.

What the test substitutes, and why (nothing else):
- The checkout: a temporary directory with `examples/` and `.venv` linked to this repository's and `var/`
  inside it, so the README's relative paths (`var/strictq/client.env`, `$PWD/.venv/bin`) hold and nothing
  lands in the real `var/`. The README's `/work/main` in output lines is that directory.
- `$ make run` (it serves until Ctrl-C, in another terminal): the test starts `strictq serve --data-dir
  var/strictq` in the background itself and checks the README's lines against its start-up lines.
  `make demo` and `make test` are not walkthrough commands (tests/test_demo.py runs the demo).
- Fixed ports (PORTS): each is rewritten to a free one, so the walkthrough runs beside a real `make run`
  and other tests; the egress proxies' ports are picked with their admin port (+10) free too.

Checks: every command exits 0, or the status the README shows with a following `$ echo $?`; within
PER_COMMAND seconds. Every output line the README shows appears in what the command printed (stdout and
stderr), where volatile parts (ids, receipts, times, ports, numbers of 5+ digits, decimals) match anything
and runs of blanks any blanks; table rows and UNSTABLE lines (figures that vary run to run) are not
compared. Everything started (the test's serve, the shell's process group) is stopped at the end.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kit.process import CLIENT_ENV, LISTENING, ROOT, ChildProcess, launch, strictq

README = ROOT / "README.md"
CHECKOUT = "/work/main"  # where the README's sample output was made (`strictq: ca /work/main/var/...`)
MAKE_RUN = "make run"
MAKE_RUN_PORT, MAKE_RUN_PROXY_PORT = 8443, 8480  # make run's defaults (Makefile: PORT, strictq serve)
PORTS = (8443, 8480, 8444, 8481, 8470, 8099)  # every fixed port the walkthrough's commands use
PROXY_PORTS = (8480, 8481)  # egress proxies: their admin port is the port + 10
PER_COMMAND = 120.0  # seconds; a Spark job starts a JVM (5-10 s alone, more on a busy machine)
STOP_WAIT = 15.0

# Output lines shown in the README whose figures vary from run to run: Spark's batch figures (segments,
# MiB, rates, files). Everything else shown is compared.
UNSTABLE = (re.compile(r"^strictq: index: (indexing batch|batch \d|.*new batch)"),)
TABLE = re.compile(r"[│┃┏┡└┌├╭╰]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
VOLATILE = re.compile(
    r"(?P<receipt>\b[0-9a-f]+\.[0-9a-f]{16}\b)"
    r"|(?P<time>\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)"
    r"|(?P<address>127\.0\.0\.1:\d+)"
    r"|(?P<id>\b[0-9a-f]{16}\b)"
    r"|(?P<number>\d[\d,]*\.\d+(?![0-9a-f])|\d{5,})"
    r"|(?P<elided>\.\.\.)"
    r"|(?P<blank>\s+)"
)
WILDCARD = {
    "receipt": r"[0-9a-f]+\.[0-9a-f]{16}",
    "time": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z",
    "address": r"127\.0\.0\.1:\d+",
    "id": r"[0-9a-f]{16}",
    "number": r"\d[\d,]*(?:\.\d+)?",
    "elided": r".*",
    "blank": r"\s+",
}
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


@dataclass
class Command:
    text: str  # as the README has it (continuation lines and heredoc included)
    line: int  # README line number of its `$ ` line
    shown: list[str] = field(default_factory=list)  # output lines shown beneath it
    expect: int = 0  # exit status: 0, or what a following `$ echo $?` shows


def walkthrough(readme: str) -> list[Command]:
    """The commands of the README's console blocks, in order, with the output each shows."""
    commands: list[Command] = []
    lines = readme.splitlines()
    in_console = False
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("```"):
            in_console = not in_console and line.strip() == "```console"
            continue
        if not in_console:
            continue
        if line.startswith("$ "):
            command = Command(line[2:], i)
            while command.text.endswith("\\") and i < len(lines):
                command.text += "\n" + lines[i]
                i += 1
            if heredoc := HEREDOC.search(command.text):
                while i < len(lines):
                    command.text += "\n" + lines[i]
                    i += 1
                    if lines[i - 1].strip() == heredoc.group(2):
                        break
            commands.append(command)
        elif commands and line.strip():
            commands[-1].shown.append(line)
        elif line.strip():
            raise AssertionError(f"README.md:{i}: output before any command in a console block: {line!r}")
    for command, after in itertools.pairwise(commands):
        if after.text.strip() == "echo $?":
            assert after.shown, f"README.md:{after.line}: `echo $?` shows no status"
            command.expect = int(after.shown[0])
    return commands


def pattern(shown: str, root: Path) -> re.Pattern[str] | None:
    """What an output line the README shows must match; None when it is not compared."""
    text = shown.strip().replace(CHECKOUT, str(root))
    if text == "..." or TABLE.search(text) or any(p.search(text) for p in UNSTABLE):
        return None
    out, at = [], 0
    for match in VOLATILE.finditer(text):
        out.append(re.escape(text[at : match.start()]))
        out.append(WILDCARD[match.lastgroup or "blank"])
        at = match.end()
    out.append(re.escape(text[at:]))
    return re.compile("".join(out))


def free_ports(count: int, *, with_admin: int = 0) -> list[int]:
    """`count` distinct free loopback ports; the first `with_admin` also have port + 10 free."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        wanted = [port, port + 10] if len(found) < with_admin else [port]
        if any(p in found or p + 10 in found or p > 65535 or not bindable(p) for p in wanted):
            continue
        found.append(port)
    return found


def bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def rewrite_ports(text: str, ports: dict[int, int]) -> str:
    return re.sub(r"\b(\d{4})\b", lambda m: str(ports.get(int(m.group(1)), m.group(1))), text)


def script(commands: list[Command], ports: dict[int, int], results: Path) -> str:
    """One bash script: each command's output to <n>.out, its status to <n>.status, `$?` kept for the
    next command (so `echo $?` shows it)."""
    parts = []
    for n, command in enumerate(commands):
        if command.text == MAKE_RUN:
            parts.append(f"echo 0 > {results}/{n}.status\n")
            continue
        parts.append(
            f"{{ {rewrite_ports(command.text, ports)}\n}} > {results}/{n}.out 2>&1 < /dev/null\n"
            f"__status=$?; echo $__status > {results}/{n}.tmp; mv {results}/{n}.tmp {results}/{n}.status\n"
            f"(exit $__status)\n"
        )
    return "".join(parts)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the shell's process group (what it left running in the background), SIGKILL to what is
    left of it after STOP_WAIT."""
    proc.poll()  # reap the shell if it ended: a zombie still counts as a member of its group
    for sig, wait in ((signal.SIGTERM, STOP_WAIT), (signal.SIGKILL, 5.0)):
        if not group_alive(proc.pid):
            break
        os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    proc.wait(timeout=5)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def output_of(results: Path, n: int) -> str:
    try:
        return ANSI.sub("", (results / f"{n}.out").read_text(errors="replace"))
    except FileNotFoundError:
        return ""


@pytest.mark.xdist_group("readme")
@pytest.mark.timeout(600)
def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    commands = walkthrough(README.read_text())
    texts = [c.text for c in commands]
    assert MAKE_RUN in texts and texts.index(MAKE_RUN) == 0, texts[:3]  # the walkthrough starts with it
    assert len(commands) > 40, len(commands)  # the parser found the walkthrough, not a fragment of it

    root = tmp_path / "checkout"
    (root / "var").mkdir(parents=True)
    (root / "examples").symlink_to(ROOT / "examples")
    (root / ".venv").symlink_to(ROOT / ".venv")
    results = tmp_path / "results"
    results.mkdir()
    picked = free_ports(len(PORTS), with_admin=len(PROXY_PORTS))
    ordered = [*PROXY_PORTS, *(p for p in PORTS if p not in PROXY_PORTS)]
    ports = dict(zip(ordered, picked, strict=True))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STRICTQ_", "AWS_"))}
    if "STRICTQ_SPARK_JAVA_OPTIONS" in os.environ:  # the suite's quicker JVM start (conftest): no change
        clean["STRICTQ_SPARK_JAVA_OPTIONS"] = os.environ["STRICTQ_SPARK_JAVA_OPTIONS"]  # of behaviour

    serve: ChildProcess | None = None
    shell: subprocess.Popen[bytes] | None = None
    try:
        make_run = strictq("serve", "--data-dir", str(root / "var" / "strictq"))
        make_run += ["--port", str(ports[MAKE_RUN_PORT]), "--proxy-port", str(ports[MAKE_RUN_PROXY_PORT])]
        serve = launch(  # `make run`, in the background, on free ports
            make_run,
            tmp_path / "make-run.log",
            wait_for=[LISTENING, CLIENT_ENV],
            env=clean,
        )
        (tmp_path / "walkthrough.sh").write_text(script(commands, ports, results))
        shell = subprocess.Popen(
            ["bash", str(tmp_path / "walkthrough.sh")],
            cwd=root,
            env=clean,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: whatever it leaves running is stopped with it
        )
        for n, command in enumerate(commands):
            status_file = results / f"{n}.status"
            deadline = time.monotonic() + PER_COMMAND
            while not status_file.exists():
                assert shell.poll() is None or status_file.exists(), (
                    f"README.md:{command.line}: the shell ended before `{command.text}` finished"
                )
                assert time.monotonic() < deadline, (
                    f"README.md:{command.line}: `{command.text}` still running after {PER_COMMAND} s; "
                    f"output so far:\n{output_of(results, n)}"
                )
                time.sleep(0.05)
            status = int(status_file.read_text())
            assert status == command.expect, (
                f"README.md:{command.line}: `{command.text}` exited {status} (expected {command.expect}); "
                f"output:\n{output_of(results, n)}"
            )
        shell.wait(timeout=PER_COMMAND)

        missing = []
        for n, command in enumerate(commands):
            printed = serve.lines if command.text == MAKE_RUN else output_of(results, n).splitlines()
            actual = [line.strip() for line in printed]
            for shown in command.shown:
                wanted = pattern(shown, root)
                if wanted is not None and not any(wanted.fullmatch(line) for line in actual):
                    missing.append(
                        f"README.md:{command.line}: `{command.text}` did not print {shown.strip()!r}; "
                        f"it printed:\n" + "\n".join(actual)
                    )
        assert not missing, "\n\n".join(missing)
    finally:
        if shell is not None:
            stop_group(shell)
        if serve is not None:
            serve.stop()
