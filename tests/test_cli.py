"""The `strictq` command as a user runs it: a subprocess talking to a real `strictq queue-server` through
STRICTQ_QUEUE_URL (its internal API). Against `strictq serve` (the gateway, STRICTQ_URL):
tests/test_cli_gateway.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import ServerProcess

SUBCOMMANDS = ["queue-server", "send", "poll", "ack", "peek", "size", "queues"]


def strictq_command() -> list[str]:
    """The installed console script when the venv has it, else `python -m strictq`."""
    script = Path(sys.executable).with_name("strictq")
    if script.exists():
        return [str(script)]
    found = shutil.which("strictq")
    return [found] if found else [sys.executable, "-m", "strictq"]


def run(url: str | None, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRICTQ_")}
    if url is not None:  # a queue server's internal API: with the run's internal secret
        env["STRICTQ_QUEUE_URL"] = url
        env["STRICTQ_INTERNAL_SECRET_FILE"] = os.environ["STRICTQ_INTERNAL_SECRET_FILE"]
    return subprocess.run(
        [*strictq_command(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


def lines(result: subprocess.CompletedProcess[str]) -> list[Any]:
    return [orjson.loads(line) for line in result.stdout.splitlines() if line.strip()]


def ok(result: subprocess.CompletedProcess[str]) -> list[Any]:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return lines(result)


def names(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout.splitlines()


def dead_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


# -------------------------------------------------------------------------------------------- help
def test_top_level_help_lists_every_command() -> None:
    result = run(None, "--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert name in result.stdout
    assert "STRICTQ_URL" in result.stdout


def test_no_command_prints_help_and_exits_2() -> None:
    result = run(None)
    assert result.returncode == 2
    assert "usage: strictq" in result.stdout


@pytest.mark.parametrize(
    "command,explains",
    [
        ("queue-server", ["--data-dir", "--port", "SIGTERM", "listening on"]),
        ("send", ["BODY", "--group", "--dedup-id", "--json", "stdin", "STRICTQ_URL"]),
        ("poll", ["--limit", "--ttl", "--wait", "--worker", "STRICTQ_URL"]),
        ("ack", ["RECEIPT", "--id", "--token", "superseded", "STRICTQ_URL"]),
        ("peek", ["--limit", "STRICTQ_URL"]),
        ("size", ["queue", "STRICTQ_URL"]),
        ("queues", ["--prefix", "STRICTQ_URL"]),
    ],
)
def test_help_on_every_subcommand(command: str, explains: list[str]) -> None:
    result = run(None, command, "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines
    assert text.startswith(f"usage: strictq {command}")
    for phrase in explains:
        assert phrase in text, (phrase, result.stdout)


# ------------------------------------------------------------------------------------ client commands
def test_send_poll_ack_peek_size_queues(server: ServerProcess) -> None:
    url = server.url
    sent = ok(run(url, "send", "orders", "--group", "customer-1", "first", "second"))
    assert [r["group"] for r in sent] == ["customer-1", "customer-1"]
    assert sent[0]["seq"] < sent[1]["seq"] and not any(r["duplicate"] for r in sent)

    # Options may also follow bodies; bodies may come from standard input, one per non-empty line.
    mixed = ok(run(url, "send", "orders", "third", "--group", "customer-1", "fourth"))
    assert [r["group"] for r in mixed] == ["customer-1", "customer-1"]
    piped = ok(run(url, "send", "orders", "--group", "customer-2", "-", stdin="line 1\nline 2\n\nline 3\n"))
    assert len(piped) == 3 and {r["group"] for r in piped} == {"customer-2"}
    as_json = ok(run(url, "send", "orders", "--group", "customer-3", "--json", '{"order": 1}'))
    assert len(as_json) == 1

    assert names(run(url, "queues")) == ["orders"]  # plain names, one per line
    assert ok(run(url, "queues", "--json")) == ["orders"]
    assert names(run(url, "queues", "--prefix", "ord")) == ["orders"]
    assert names(run(url, "queues", "--prefix", "zzz")) == []
    (size,) = ok(run(url, "size", "orders"))
    assert "orders" in (size.get("name"), size.get("queue"))
    assert size["total"] == 8 and size["in_flight"] == 0

    peeked = ok(run(url, "peek", "orders", "--limit", "100"))
    assert [m["body"] for m in peeked] == [
        "first", "second", "third", "fourth", "line 1", "line 2", "line 3", '{"order":1}'
    ]  # fmt: skip

    polled = ok(run(url, "poll", "orders", "--limit", "4", "--ttl", "30", "--worker", "cli-test"))
    assert [m["body"] for m in polled] == ["first", "second", "third", "fourth"]
    assert all(m["receipt"] and m["group"] == "customer-1" for m in polled)
    # The group is claimed: the next poll starts with customer-2.
    nxt = ok(run(url, "poll", "orders", "--limit", "1", "--ttl", "30"))
    assert [m["body"] for m in nxt] == ["line 1"]

    acked = ok(run(url, "ack", "orders", *[m["receipt"] for m in polled]))
    assert [a["status"] for a in acked] == ["ok"] * 4
    again = ok(run(url, "ack", "orders", polled[0]["receipt"]))  # already deleted: `gone` is fine
    assert [a["status"] for a in again] == ["gone"]
    (size,) = ok(run(url, "size", "orders"))
    assert size["total"] == 4 and size["in_flight"] == 1


def test_ack_by_id_and_stale_receipt_exit_codes(server: ServerProcess) -> None:
    url = server.url
    ok(run(url, "send", "q", "--group", "g", "--id", "m-1", "one"))
    (claim,) = ok(run(url, "poll", "q", "--ttl", "30"))
    stale = run(url, "ack", "q", "--id", "m-1", "--token", str(claim["token"] - 1))
    assert stale.returncode == 1
    assert [a["status"] for a in lines(stale)] == ["stale_claim"]
    assert [a["status"] for a in ok(run(url, "ack", "q", "--id", "m-1", "--token", str(claim["token"])))] == [
        "ok"
    ]


def test_send_dedup_delay_and_bad_entries(server: ServerProcess) -> None:
    url = server.url
    (first,) = ok(run(url, "send", "d", "--group", "g", "--dedup-id", "k1", "hello"))
    (second,) = ok(run(url, "send", "d", "--group", "g", "--dedup-id", "k1", "hello"))
    assert second["duplicate"] is True and second["id"] == first["id"]
    ok(run(url, "send", "d", "--group", "later", "--delay", "600", "delayed"))
    (size,) = ok(run(url, "size", "d"))
    assert size["total"] == 2 and size["delayed"] == 1

    bad_group = run(url, "send", "d", "--group", "has space", "x")
    assert bad_group.returncode == 1
    assert lines(bad_group)[0]["error"]["code"] == "invalid_argument"
    bad_json = run(url, "send", "d", "--json", "{not json")
    assert bad_json.returncode == 2 and "not valid JSON" in bad_json.stderr
    nothing = run(url, "send", "d")
    assert nothing.returncode == 2 and "nothing to send" in nothing.stderr
    no_receipts = run(url, "ack", "d")
    assert no_receipts.returncode == 2 and "RECEIPT" in no_receipts.stderr
    unknown_option = run(url, "poll", "d", "--bogus")
    assert unknown_option.returncode == 2 and "unrecognized arguments" in unknown_option.stderr


def test_server_side_errors_exit_1_with_the_code(server: ServerProcess) -> None:
    missing = run(server.url, "poll", "no-such-queue")
    assert missing.returncode == 1
    assert "404 queue_not_found" in missing.stderr and "Traceback" not in missing.stderr
    bad_limit = run(server.url, "peek", "no-such-queue", "--limit", "0")
    assert bad_limit.returncode == 1 and "Traceback" not in bad_limit.stderr
    bad_receipt = run(server.url, "ack", "x", "not-a-receipt")
    assert bad_receipt.returncode == 1 and "Traceback" not in bad_receipt.stderr


@pytest.mark.parametrize(
    "args", [["size", "q"], ["queues"], ["poll", "q"], ["peek", "q"], ["send", "q", "x"], ["ack", "q", "1.x"]]
)
def test_dead_url_is_a_clear_error(args: list[str]) -> None:
    url = dead_url()
    result = run(url, *args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "cannot reach" in result.stderr and url in result.stderr
    assert "STRICTQ_QUEUE_URL" in result.stderr and "strictq queue-server" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("url", ["127.0.0.1:8470", "http://127.0.0.1:notaport"])
def test_malformed_url_is_a_clear_error(url: str) -> None:
    result = run(url, "size", "q")
    assert result.returncode in (1, 2)
    assert "Traceback" not in result.stderr, result.stderr
    assert "STRICTQ_QUEUE_URL" in result.stderr
