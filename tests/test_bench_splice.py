"""`python -m bench.run --only X --splice`: only the sections of the scenarios run replace their namesakes
in the existing report; every other section (older figures) stays as it was."""

from __future__ import annotations

from bench.report import splice

EXISTING = """# Benchmarks

## Machine

old machine

## Through the gateway (HTTPS, `strictq serve`)

old gateway figures

## Cluster: partitions

old cluster figures

## The gap to Redis Streams, and what would close it

gap

## Method

method
"""


def fresh(cluster: str, extra: str = "") -> str:
    return (
        "# Benchmarks\n\n## Machine\n\nnew machine\n\n## Command\n\nnew command\n\n"
        f"## Cluster: partitions\n\n{cluster}\n\n{extra}"
        "## The gap to Redis Streams, and what would close it\n\nnew gap\n\n## Method\n\nnew method\n"
    )


def test_a_section_run_now_replaces_its_namesake_and_nothing_else() -> None:
    out = splice(EXISTING, fresh("new cluster figures\n\n### sub\n\nmore"))
    assert "new cluster figures" in out and "### sub\n\nmore" in out
    assert "old cluster figures" not in out
    for kept in ("old machine", "old gateway figures", "\ngap\n", "\nmethod\n"):
        assert kept in out
    for dropped in ("new machine", "new command", "new gap", "new method"):
        assert dropped not in out
    assert splice(out, fresh("new cluster figures\n\n### sub\n\nmore")) == out  # idempotent


def test_a_new_section_goes_before_the_closing_ones() -> None:
    out = splice(EXISTING, fresh("c", "## Something new\n\nfigures\n\n"))
    titles = [line for line in out.splitlines() if line.startswith("## ")]
    assert titles == [
        "## Machine",
        "## Through the gateway (HTTPS, `strictq serve`)",
        "## Cluster: partitions",
        "## Something new",
        "## The gap to Redis Streams, and what would close it",
        "## Method",
    ]
