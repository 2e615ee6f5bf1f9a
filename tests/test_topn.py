"""Multi-tier processing (issue 18): the top-N hashtags of a generated stream, computed by SDK workers over
strict queues in four tiers (scenarios/topn), equals the top N a Spark job computes over the raw stream.

- The tiers' steps alone, under the delivery a strict queue gives (per-group order, at least once): every
  message may be run again after its emits were sent, or after its state was saved, and every emit may
  arrive twice; the answer is still the exact top N and totals (a seeded simulation, many seeds).
- `GroupStates` export / import, and fenced checkpoints (an older claim's save is refused).
- Spark's ranking and the tiers' break ties the same way (by tag), on a stream made of ties.
- End to end against a real `strictq serve` over TLS, with the real SDK and Spark in local mode: the
  tiers' answer equals Spark's; and again with a summarise worker stopped hard mid-stream (its running
  handlers cancelled, its groups going to the other one with their saved state).
"""

from __future__ import annotations

import copy
import os
import random
import re
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scenarios.settings import Settings
from scenarios.system import System
from scenarios.topn.posts import (
    Post,
    StreamSpec,
    count_hashtags,
    generate,
    hashtags,
    read_stream,
    top_n,
    write_stream,
)
from scenarios.topn.run import Plan, StopPlan, TiersReport, run_tiers
from scenarios.topn.state import Checkpoints, GroupStates
from scenarios.topn.tiers import TIERS, Topology
from spark.topn import top_hashtags

pytestmark = pytest.mark.timeout(240)
SMALL = StreamSpec(posts=300, vocabulary=60, seed=5)


def expected(posts: list[Post], n: int) -> dict[str, Any]:
    counts = count_hashtags(posts)
    return {
        "top": [list(item) for item in top_n(counts, n)],
        "tags": len(counts),
        "mentions": sum(counts.values()),
    }


# ----------------------------------------------------------------------------- the steps, redelivered
def simulate(posts: list[Post], topology: Topology, rng: random.Random, chaos: float) -> dict[str, Any]:
    """Run the tiers' steps as a strict queue delivers: any group's head message next (groups interleave
    at random), one at a time per group; with probability `chaos` a run stops after its emits (state not
    saved) or after saving (not acked), and the message is delivered again; any emit may be sent twice."""
    tier_of = {queue: tier for tier in TIERS for queue in topology.queues(tier)}
    queued: dict[tuple[str, str], deque[dict[str, Any]]] = defaultdict(deque)
    numbers: dict[str, int] = defaultdict(int)
    for post in posts:
        queue, group = topology.source_of(post.author)
        numbers[group] += 1
        queued[queue, group].append({"kind": "post", "id": post.id, "k": numbers[group], "text": post.text})
    for queue, group in topology.sources_all():
        queued[queue, group].append({"kind": "end", "sources": topology.sources})
    saved: dict[tuple[str, str], dict[str, Any]] = {}
    answer: dict[str, Any] | None = None
    redelivered = duplicated = 0
    while busy := sorted(key for key, messages in queued.items() if messages):
        queue, group = rng.choice(busy)
        tier = tier_of[queue]
        step = TIERS[tier](
            topology, copy.deepcopy(saved.get((tier, group), {})), group, queued[queue, group][0]
        )
        for emit in step.emits:
            queued[emit.queue, emit.group].append(emit.payload)
            if rng.random() < chaos:
                queued[emit.queue, emit.group].append(emit.payload)
                duplicated += 1
        if rng.random() < chaos:
            redelivered += 1
            continue  # stopped before its state was saved
        saved[tier, group] = step.state
        if rng.random() < chaos:
            redelivered += 1
            continue  # stopped before the ack
        queued[queue, group].popleft()
        answer = step.result or answer
    assert answer is not None, "the final tier never had every prefix"
    assert chaos == 0 or (redelivered and duplicated)
    return answer


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), chaos=st.sampled_from([0.0, 0.1, 0.3]))
def test_the_steps_count_exactly_once_under_redelivery_and_duplicate_emits(seed: int, chaos: float) -> None:
    posts = list(generate(StreamSpec(posts=250, vocabulary=40, seed=seed % 1000)))
    topology = Topology(sources=4, top=5)
    assert simulate(posts, topology, random.Random(seed), chaos) == expected(posts, 5)


def test_a_source_without_posts_and_a_prefix_without_tags_still_complete() -> None:
    posts = [Post("p1", "u1", "only #one tag"), Post("p2", "u1", "no tag at all #")]
    topology = Topology(sources=3, top=3)  # two sources get nothing but their end marker
    answer = simulate(posts, topology, random.Random(1), 0.2)
    assert answer == {"top": [["one", 1]], "tags": 1, "mentions": 1}


def test_hashtags_are_lower_cased_and_counted_once_per_post() -> None:
    assert hashtags("#Rust is #rust! and ##queues, #, #a_1 #RUST") == ["rust", "queues", "a_1"]


# ------------------------------------------------------------------------------- state and checkpoints
def test_group_states_export_and_import_only_the_groups_asked_for() -> None:
    old, new = GroupStates("summarise"), GroupStates("summarise")
    old.put("rust", {"sources": {"s001": [4, 3]}})
    old.put("go", {"sources": {"s002": [1, 1]}})
    assert new.import_(old.export(["rust", "absent"])) == ["rust"]
    assert new.groups() == ["rust"] and new.get("rust") == {"sources": {"s001": [4, 3]}}
    with pytest.raises(ValueError, match="tier 'map'"):
        GroupStates("map").import_(old.export(["go"]))


def test_checkpoints_refuse_a_save_under_an_older_claim(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path / "checkpoints.sqlite3")
    try:
        assert checkpoints.save("summarise", "rust", 7, "worker-1", b"seven")
        assert checkpoints.save("summarise", "rust", 9, "worker-2", b"nine")
        assert not checkpoints.save("summarise", "rust", 8, "worker-1", b"stale")  # its claim expired
        saved = checkpoints.load("summarise", "rust")
        assert saved is not None and (saved.token, saved.worker, saved.blob) == (9, "worker-2", b"nine")
        assert checkpoints.load("map", "rust") is None
    finally:
        checkpoints.close()


# ----------------------------------------------------------------------------------------- Spark alone
def test_spark_breaks_ties_by_tag_as_the_tiers_do(spark: Any, tmp_path: Path) -> None:
    texts = ["#b #a", "#c #B", "#a #c", "#d", "#e #d #D", "#e"]  # a, b, c, d, e: 2 each, in a 3-way cut
    posts = [Post(f"p{i}", "u", text) for i, text in enumerate(texts)]
    path = tmp_path / "ties.jsonl"
    write_stream(path, posts)
    result = top_hashtags(spark, path, 3)
    assert result.top == [("a", 2), ("b", 2), ("c", 2)] == top_n(count_hashtags(posts), 3)
    assert (result.tags, result.mentions, result.posts) == (5, 10, 6)


# --------------------------------------------------------------------------- end to end, against Spark
async def run_against_serve(tmp_path: Path, spec: StreamSpec, plan: Plan) -> tuple[TiersReport, Path]:
    posts_file = tmp_path / "posts.jsonl"
    write_stream(posts_file, generate(spec))
    system = System(tmp_path / "system", Settings(workers=plan.worker_count))
    await system.start()
    try:
        return await run_tiers(system, posts_file, plan), posts_file
    finally:
        await system.stop()


def assert_equals_spark(spark: Any, report: TiersReport, posts_file: Path, n: int) -> None:
    theirs = top_hashtags(spark, posts_file, n)
    assert report.top == theirs.top
    assert (report.answer["tags"], report.answer["mentions"]) == (theirs.tags, theirs.mentions)
    assert report.posts == theirs.posts
    assert report.answer == expected(list(read_stream(posts_file)), n)  # and the plain-Python count


E2E = StreamSpec(posts=800, vocabulary=80, seed=18)


async def test_the_tiers_top_n_equals_sparks(spark: Any, tmp_path: Path) -> None:
    plan = Plan(topology=Topology(top=10), timeout=180)
    report, posts_file = await run_against_serve(tmp_path, E2E, plan)
    assert_equals_spark(spark, report, posts_file, 10)
    # Every tier did its part: each post mapped (at least) once, every prefix's result reached the final.
    assert report.stats["map"].notes["post"] >= report.posts
    final = report.stats["final"].notes
    assert final["result"] + final["answer"] >= len(plan.topology.prefixes)


async def test_a_summarise_worker_stopped_mid_stream_leaves_the_answer_exact(
    spark: Any, tmp_path: Path
) -> None:
    mentions = sum(count_hashtags(generate(E2E)).values())
    stop = StopPlan(tier="summarise", index=0, after=mentions // 3, grace=0.0)
    plan = Plan(topology=Topology(top=10), stop=stop, timeout=180)
    report, posts_file = await run_against_serve(tmp_path, E2E, plan)
    assert report.stopped is not None and report.stopped.worker == report.workers["summarise"][0]
    assert report.stopped.handled > 0  # it had groups, and state, when it stopped
    assert report.handled_after_stop == 0
    assert report.taken_over > 0  # its groups went on from the state it had saved
    assert report.stats["summarise"].total > report.stopped.tier_handled  # the rest: the other worker
    assert_equals_spark(spark, report, posts_file, 10)


# ------------------------------------------------------------------------------------- the entry point
def test_the_entry_point_prints_the_tiers_top_n(tmp_path: Path) -> None:
    """`python -m scenarios.topn` (without Spark: its check is the tests above) starts its own serve, runs
    the tiers and prints the top N, which is the stream's."""
    argv = ["--posts", "300", "--vocabulary", "30", "--top", "5", "--seed", "7", "--no-spark"]
    proc = subprocess.run(
        [sys.executable, "-m", "scenarios.topn", *argv, "--data-dir", str(tmp_path / "run")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = re.findall(r"^\s+\d+\s+#(\w+)\s+(\d+)$", proc.stdout, re.MULTILINE)
    posts = list(read_stream(tmp_path / "run" / "posts.jsonl"))
    assert len(posts) == 300
    assert [(tag, int(count)) for tag, count in shown] == top_n(count_hashtags(posts), 5)
    usage = subprocess.run(
        [sys.executable, "-m", "scenarios.topn", "--posts", "0"], capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 2 and "--posts: must be at least 1" in usage.stderr
    assert "Traceback" not in usage.stderr
