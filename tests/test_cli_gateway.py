"""The `strictq` client and admin commands against a real `strictq serve` (HTTPS gateway), as a newcomer runs
them after `make run`: `set -a; . <data-dir>/client.env; set +a`, then `strictq ...` in a shell (issue 14,
"the first hour"). Each command is a subprocess; a failure must be one line on stderr, never a traceback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson
import pytest
from serve_support import Serve, start_serve, stop

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"
SCRIPT = Path(sys.executable).with_name("strictq")


# After `make run`, in another terminal at the checkout; README.md's walkthrough itself runs in
# tests/test_readme_walkthrough.py.
LOAD = "set -a; . var/strictq/client.env; set +a\n"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    # <root>/var/strictq: `make run`'s layout, so the walkthrough runs from <root> as written.
    running = start_serve(tmp_path_factory.mktemp("cli-gateway") / "var" / "strictq", tls=True)
    try:
        yield running
    finally:
        stop(running)


def shell(serve: Serve, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`script` in bash at the root of `make run`'s layout after loading the client env the way the README
    says; `env` set (or, when "", unset) after loading it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STRICTQ_", "AWS_"))}
    clean["PATH"] = f"{SCRIPT.parent}{os.pathsep}{clean.get('PATH', '')}"
    prelude = LOAD
    if not SCRIPT.exists():  # a checkout without the console script
        prelude += f'strictq() {{ {shlex.quote(sys.executable)} -m strictq "$@"; }}\n'
    for name, value in env.items():
        prelude += f"export {name}={shlex.quote(value)}\n" if value else f"unset {name}\n"
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", prelude + script],
        cwd=serve.data_dir.parent.parent,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def strictq(serve: Serve, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return shell(serve, "strictq " + " ".join(shlex.quote(a) for a in args), **env)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def jsonl(text: str) -> list[Any]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strictq: "), result.stderr
    return lines[0]


def test_client_commands_work_against_strictq_serve(serve: Serve) -> None:
    orders = ('{"order": 1}', '{"order": 2}')
    sent = ok(strictq(serve, "send", "cart", "--group", "customer-1", "--json", *orders))
    assert jsonl(sent) == [{"queue": "cart", "group": "customer-1", "sent": 2}]
    ok(strictq(serve, "send", "cart", "--group", "customer-2", "plain text"))  # a JSON string payload

    assert "cart" in ok(strictq(serve, "queues")).splitlines()  # plain names, one per line
    assert jsonl(ok(strictq(serve, "queues", "--prefix", "car", "--json"))) == ["cart"]
    assert ok(strictq(serve, "queues", "--prefix", "zzz")) == ""
    assert jsonl(ok(strictq(serve, "size", "cart"))) == [{"name": "cart", "total": 3, "in_flight": 0}]
    peeked = jsonl(ok(strictq(serve, "peek", "cart")))
    assert [m["payload"] for m in peeked] == [{"order": 1}, {"order": 2}, "plain text"]

    polled = jsonl(ok(strictq(serve, "poll", "cart", "--ttl", "30", "--limit", "10")))
    assert [m["payload"] for m in polled] == [{"order": 1}, {"order": 2}, "plain text"]
    first = polled[0]
    assert first["receipt"] == f"{first['token']:x}.{first['id']}"  # the queue server's receipt form
    # A receipt of an older claim of the same message is refused (the fencing token is in it).
    stale = strictq(serve, "ack", "cart", f"{first['token'] - 1:x}.{first['id']}")
    assert stale.returncode == 1 and "Traceback" not in stale.stderr
    assert [r["status"] for r in jsonl(stale.stdout)] == ["stale_claim"]

    acked = jsonl(ok(strictq(serve, "ack", "cart", *[m["receipt"] for m in polled])))
    assert [a["status"] for a in acked] == ["ok", "ok", "ok"]
    assert jsonl(ok(strictq(serve, "size", "cart"))) == [{"name": "cart", "total": 0, "in_flight": 0}]


def test_options_of_the_queue_server_alone_are_refused_by_name(serve: Serve) -> None:
    for args, flag in [
        (("send", "orders", "--delay", "5", "x"), "--delay"),
        (("send", "orders", "--dedup-id", "d", "x"), "--dedup-id"),
        (("poll", "orders", "--worker", "alice"), "--worker"),
    ]:
        line = one_line_error(strictq(serve, *args), 2)
        assert flag in line and "queue-server" in line, line


def test_each_command_names_the_key_it_needs(serve: Serve) -> None:
    line = one_line_error(strictq(serve, "poll", "orders", STRICTQ_WORKER_SECRET="", STRICTQ_ADMIN_KEY=""), 2)
    assert "STRICTQ_WORKER_SECRET" in line and "client.env" in line
    line = one_line_error(strictq(serve, "size", "orders", STRICTQ_ADMIN_KEY=""), 2)
    assert "STRICTQ_ADMIN_KEY" in line
    refused = one_line_error(strictq(serve, "size", "orders", STRICTQ_ADMIN_KEY="not-a-key-0123456789"))
    assert "403" in refused


# ------------------------------------------------------------------------------- unknown queues
def test_an_unknown_queue_is_named_as_the_user_named_it(serve: Serve) -> None:
    commands = [("size",), ("peek",), ("poll",), ("suspend", "--reason", "x"), ("resume",)]
    for command, *rest in commands:
        args = (command, "nosuchq", *rest)
        line = one_line_error(strictq(serve, *args))
        assert "'nosuchq'" in line and "does not exist" in line, (args, line)
        assert "dev." not in line, line  # never the core's tenant-prefixed name


# ------------------------------------------------------------------------------------------- TLS
@pytest.mark.parametrize("command", [("size", "orders"), ("fences",)])
def test_a_missing_ca_file_is_named_not_blamed_on_the_server(serve: Serve, command: tuple[str, ...]) -> None:
    line = one_line_error(strictq(serve, *command, STRICTQ_CA_FILE="/nonexistent/ca.pem"), 2)
    assert "STRICTQ_CA_FILE=/nonexistent/ca.pem" in line and "tls/ca.pem" in line, line
    assert "running" not in line, line
    line = one_line_error(strictq(serve, *command, STRICTQ_CA_FILE="/tmp"), 2)
    assert "STRICTQ_CA_FILE=/tmp: a directory, not a file" in line, line

    line = one_line_error(strictq(serve, *command, STRICTQ_CA_FILE=""))
    assert "not trusted" in line and "STRICTQ_CA_FILE" in line and "tls/ca.pem" in line, line
    assert "running" not in line, line


@pytest.mark.parametrize("command", [("size", "orders"), ("fences",)])
def test_http_on_the_https_port_says_use_https(serve: Serve, command: tuple[str, ...]) -> None:
    plain = serve.url.replace("https://", "http://")
    line = one_line_error(strictq(serve, *command, STRICTQ_URL=plain))
    assert f"use {serve.url}" in line, line


def test_a_queue_server_url_that_is_the_gateway_is_explained(serve: Serve) -> None:
    line = one_line_error(strictq(serve, "size", "orders", STRICTQ_QUEUE_URL=serve.url))
    assert "not a `strictq queue-server`" in line and "STRICTQ_QUEUE_URL" in line, line


def test_https_on_a_plain_http_server_says_use_http(server: Any) -> None:
    url = server.url.replace("http://", "https://")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRICTQ_", "AWS_"))}
    result = subprocess.run(
        [sys.executable, "-m", "strictq", "size", "q"],
        env={**env, "STRICTQ_QUEUE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = one_line_error(result)
    assert f"use {server.url}" in line, line
    # The gateway's STRICTQ_URL at a queue server: which variable to set instead.
    result = subprocess.run(
        [sys.executable, "-m", "strictq", "size", "q"],
        env={**env, "STRICTQ_URL": server.url, "STRICTQ_ADMIN_KEY": "k" * 24},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = one_line_error(result)
    assert "not the gateway" in line and "STRICTQ_QUEUE_URL" in line, line


# ------------------------------------------------------------------------------- admin output
def test_admin_commands_print_tables_with_iso_times_and_json_on_request(serve: Serve) -> None:
    fenced = ok(strictq(serve, "fence", "worker-2", "--mode", "block", "--reason", "cli test", "--ttl", "1h"))
    header, row = fenced.splitlines()
    assert header.split() == ["WORKER", "MODE", "SINCE", "EXPIRES", "REASON"]
    assert re.fullmatch(rf"worker-2\s+block\s+{ISO}\s+{ISO}\s+cli test", row), row
    assert not re.search(r"\d{10}\.\d", fenced)  # no epoch floats

    raw = jsonl(ok(strictq(serve, "fence", "worker-2", "--mode", "block", "--reason", "again", "--json")))
    assert raw[0]["worker"] == "worker-2" and isinstance(raw[0]["since"], float)
    assert ok(strictq(serve, "unfence", "worker-2")).strip() == "worker-2: unfenced"

    ok(strictq(serve, "send", "jobs", "--json", "1"))
    suspended = ok(strictq(serve, "suspend", "jobs", "--reason", "maintenance")).splitlines()
    assert [line.split() for line in suspended] == [
        ["QUEUE", "STATE", "REASON"],
        ["jobs", "suspended", "maintenance"],
    ]
    status = ok(strictq(serve, "status"))
    events = status.split("LATEST EVENTS", 1)[1]
    assert re.search(rf"^\s+{ISO}\s+suspend\s+queue=jobs", events, re.M), status
    assert ok(strictq(serve, "resume", "jobs")).strip() == "jobs: resumed"
    assert jsonl(ok(strictq(serve, "suspend", "jobs", "--reason", "m2", "--json"))) == [
        {"queue": "jobs", "suspended": True, "reason": "m2"}
    ]
    assert jsonl(ok(strictq(serve, "resume", "jobs", "--json"))) == [{"queue": "jobs", "resumed": True}]


def test_the_admin_key_from_the_environment_a_file_or_the_flag(serve: Serve, tmp_path: Path) -> None:
    admin = serve.secret("admin")
    wrong = "wrong-key-0123456789abcdef"
    key_file = tmp_path / "admin.key"
    key_file.write_text(admin + "\n")
    key_file.chmod(0o600)
    assert ok(strictq(serve, "fences")).strip() == "no fenced workers"  # STRICTQ_ADMIN_KEY of client.env
    # The file wins over the environment; the flag wins over the environment.
    ok(strictq(serve, "fences", "--admin-key-file", str(key_file), STRICTQ_ADMIN_KEY=wrong))
    ok(strictq(serve, "fences", "--admin-key-file", str(key_file), STRICTQ_ADMIN_KEY=""))
    ok(strictq(serve, "fences", "--admin-key", admin, STRICTQ_ADMIN_KEY=wrong))
    assert "401" in one_line_error(strictq(serve, "fences", STRICTQ_ADMIN_KEY=wrong))

    missing = one_line_error(strictq(serve, "fences", "--admin-key-file", str(tmp_path / "nope")), 2)
    assert "--admin-key-file" in missing and "nope" in missing
    assert "No such file" in missing and "Error" not in missing  # not an exception's class name
    directory = one_line_error(strictq(serve, "fences", "--admin-key-file", str(tmp_path)), 2)
    assert "Is a directory" in directory
    (tmp_path / "empty").write_text("\n")
    empty = one_line_error(strictq(serve, "fences", "--admin-key-file", str(tmp_path / "empty")), 2)
    assert "empty" in empty
    none = one_line_error(strictq(serve, "fences", STRICTQ_ADMIN_KEY=""), 2)
    assert "STRICTQ_ADMIN_KEY" in none and "--admin-key-file" in none
    both = strictq(serve, "fences", "--admin-key", admin, "--admin-key-file", str(key_file))
    assert both.returncode == 2 and "not allowed with" in both.stderr
    helped = ok(strictq(serve, "fences", "--help"))
    assert "wins over" in " ".join(helped.split())


# ---------------------------------------------------------------------------------- the parser
def test_version_is_the_installed_one() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "strictq", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == f"strictq {version('strictq')}"


@pytest.mark.parametrize(
    "args,refused",
    [
        (["fence", "worker-1", "--mod", "block", "--reason", "x"], "--mode"),
        (["poll", "orders", "--lim", "5"], "--lim"),
        (["send", "orders", "--grou", "g", "x"], "--grou"),
        (["serve", "--dat", "/tmp/nowhere"], "--dat"),
        (["wirelog", "tail", "--wire", "/tmp/nowhere"], "--wire"),
    ],
)
def test_abbreviated_options_are_refused(args: list[str], refused: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRICTQ_", "AWS_"))}
    result = subprocess.run(
        [sys.executable, "-m", "strictq", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert refused in result.stderr and "Traceback" not in result.stderr


def test_every_parser_refuses_abbreviations() -> None:
    import argparse

    from strictq.cli import build_parser

    seen = 0
    pending = [build_parser()]
    while pending:
        parser = pending.pop()
        assert parser.allow_abbrev is False, parser.prog
        seen += 1
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    assert seen > 20
