"""The four tiers of the top-N example as pure steps: (state, group, message) -> (state, emits, note).

    posts --map--> tags --summarise--> partials --aggregate--> results --final--> top N
    4 queues        2 queues            1 queue                 1 queue
    16 groups       a group per tag     16 groups               1 group
    (author shard)  (the hashtag)       (tag hash prefix)       ("top")

Every tier's group (the strict order parameter) comes from the message's content and the range shrinks
tier by tier. A worker runs a step per delivered message on its group's state (tiers.py knows nothing of
queues' I/O: scenarios/topn/workers.py does that), sends the emits, saves the new state, then acks.

Exactly once despite at-least-once delivery. A message can be delivered again (a worker stopped or
cancelled after its emits, a claim that expired) and an emit can be sent twice (a retried send, a step
run again). So every count is keyed, not added blindly:
- map: a post's tag messages carry (source group, k), k the post's number in its source group. The queue
  delivers a source's posts one at a time in order, and a step emits all of a post's tags before the post
  is acked, so within one tag's group the k of one source never go down: the summariser counts a tag
  message only if its k is above the last one counted for that source (a watermark, not a set of ids).
- summarise: on a source's end marker it emits that source's *total* for the tag, keyed (tag, source): a
  re-emit is the same message, and the aggregate stores it by key.
- aggregate: emits its prefix's result once complete (keyed by prefix); the final stores it by key.

End of stream. The producer ends each tier-1 group with an end marker naming how many tier-1 groups
(sources) there are. Map, on a source's end, sends an end marker to every tag group that source fed (so
the summariser closes that source's count) and a manifest to every aggregate group: how many (tag,
source) totals of that prefix to expect from the source. An aggregate group is complete when all sources'
manifests are in and every expected total has arrived; it sends its prefix's top N (the prefixes partition
the tags and their totals are final, so the global top N is within the union of the prefixes' top N). The
final group has everything when all prefixes have reported.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .posts import hashtags, top_n
from .state import State

HEX = "0123456789abcdef"


@dataclass(frozen=True, slots=True)
class Topology:
    """Queues and groups per tier: fewer queues (and workers) at each tier."""

    name: str = "topn"
    post_queues: int = 4
    sources: int = 8  # tier-1 groups: author shards
    tag_queues: int = 2
    prefix_chars: int = 1  # aggregate groups: the first hex digits of the tag's sha1 (16 ** chars)
    top: int = 10

    def __post_init__(self) -> None:
        if self.post_queues < 1 or self.tag_queues < 1 or self.sources < 1 or self.top < 1:
            raise ValueError("queues, sources and top must be at least 1")
        if not 1 <= self.prefix_chars <= 2:
            raise ValueError("prefix_chars must be 1 or 2")

    # the queues of each tier
    def post_queue(self, i: int) -> str:
        return f"{self.name}-posts-{i}"

    def tag_queue(self, i: int) -> str:
        return f"{self.name}-tags-{i}"

    @property
    def partial_queue(self) -> str:
        return f"{self.name}-partials"

    @property
    def result_queue(self) -> str:
        return f"{self.name}-results"

    def queues(self, tier: str) -> list[str]:
        if tier == "map":
            return [self.post_queue(i) for i in range(self.post_queues)]
        if tier == "summarise":
            return [self.tag_queue(i) for i in range(self.tag_queues)]
        return [self.partial_queue if tier == "aggregate" else self.result_queue]

    # the groups (and so the queue) of a message, from its content
    def source_of(self, author: str) -> tuple[str, str]:
        """The tier-1 (queue, group) of a post: its author's shard."""
        shard = zlib.crc32(author.encode()) % self.sources
        return self.post_queue(shard % self.post_queues), f"s{shard:03d}"

    def sources_all(self) -> list[tuple[str, str]]:
        return [(self.post_queue(s % self.post_queues), f"s{s:03d}") for s in range(self.sources)]

    def tag_route(self, tag: str) -> tuple[str, str]:
        return self.tag_queue(zlib.crc32(tag.encode()) % self.tag_queues), tag

    def prefix(self, tag: str) -> str:
        return hashlib.sha1(tag.encode()).hexdigest()[: self.prefix_chars]

    @property
    def prefixes(self) -> list[str]:
        if self.prefix_chars == 1:
            return list(HEX)
        return [a + b for a in HEX for b in HEX]

    def prefix_route(self, prefix: str) -> tuple[str, str]:
        return self.partial_queue, f"p{prefix}"

    @property
    def final_route(self) -> tuple[str, str]:
        return self.result_queue, "top"


@dataclass(frozen=True, slots=True)
class Emit:
    queue: str
    group: str
    payload: dict[str, Any]


@dataclass(slots=True)
class Step:
    state: State
    emits: list[Emit] = field(default_factory=list)
    note: str = ""  # what the message was to the step: counted, duplicate, end, ... (for progress)
    result: dict[str, Any] | None = None  # the final tier's answer, once it has everything


class BadMessage(ValueError):
    """A payload the tier does not know (not retried usefully: the run's check will fail)."""


def _emit(route: tuple[str, str], payload: dict[str, Any]) -> Emit:
    return Emit(route[0], route[1], payload)


def map_step(topo: Topology, state: State, group: str, payload: dict[str, Any]) -> Step:
    """Tier 1, group = a source (author shard). State: the tags this source fed (for its end markers)."""
    fed: list[str] = state.get("tags", [])
    kind = payload.get("kind")
    if kind == "post":
        tags = hashtags(str(payload["text"]))
        message = {"kind": "tag", "source": group, "k": int(payload["k"])}
        emits = [_emit(topo.tag_route(tag), message) for tag in tags]
        new = sorted(set(fed).union(tags))
        return Step({"tags": new} if new != fed else state, emits, "post")
    if kind == "end":
        emits = [_emit(topo.tag_route(tag), {"kind": "end", "source": group}) for tag in fed]
        per_prefix = dict.fromkeys(topo.prefixes, 0)
        for tag in fed:
            per_prefix[topo.prefix(tag)] += 1
        sources = int(payload["sources"])
        for prefix, count in per_prefix.items():
            manifest = {"kind": "manifest", "source": group, "totals": count, "sources": sources}
            emits.append(_emit(topo.prefix_route(prefix), manifest))
        return Step(state, emits, "end")
    raise BadMessage(f"map: unknown message kind {kind!r}")


def summarise_step(topo: Topology, state: State, group: str, payload: dict[str, Any]) -> Step:
    """Tier 2, group = the hashtag. State: per source, [last k counted, count]; closed sources."""
    sources: dict[str, list[int]] = state.setdefault("sources", {})
    source = str(payload["source"])
    last_k, count = sources.get(source, [0, 0])
    kind = payload.get("kind")
    if kind == "tag":
        k = int(payload["k"])
        if k <= last_k:
            return Step(state, [], "duplicate")
        if source in state.get("closed", []):
            return Step(state, [], "late")  # after the source's end: cannot happen with in-order sources
        sources[source] = [k, count + 1]
        return Step(state, [], "counted")
    if kind == "end":
        closed = state.setdefault("closed", [])
        if source not in closed:
            closed.append(source)
        total = {"kind": "total", "tag": group, "source": source, "count": count}
        return Step(state, [_emit(topo.prefix_route(topo.prefix(group)), total)], "end")
    raise BadMessage(f"summarise: unknown message kind {kind!r}")


def aggregate_step(topo: Topology, state: State, group: str, payload: dict[str, Any]) -> Step:
    """Tier 3, group = a tag-hash prefix. State: totals per tag and source, manifests, sent."""
    totals: dict[str, dict[str, int]] = state.setdefault("totals", {})
    expect: dict[str, int] = state.setdefault("expect", {})
    kind = payload.get("kind")
    if kind == "total":
        by_source = totals.setdefault(str(payload["tag"]), {})
        note = "duplicate" if str(payload["source"]) in by_source else "total"
        by_source[str(payload["source"])] = int(payload["count"])
    elif kind == "manifest":
        note = "manifest"
        expect[str(payload["source"])] = int(payload["totals"])
        state["sources"] = int(payload["sources"])
    else:
        raise BadMessage(f"aggregate: unknown message kind {kind!r}")
    if state.get("sent") or not _complete(state):
        return Step(state, [], note)
    counts = {tag: sum(by_source.values()) for tag, by_source in totals.items()}
    result = {
        "kind": "result",
        "prefix": group,
        "top": [list(item) for item in top_n(counts, topo.top)],
        "tags": len(counts),
        "mentions": sum(counts.values()),
        "prefixes": len(topo.prefixes),
    }
    state["sent"] = True
    return Step(state, [_emit(topo.final_route, result)], "complete")


def _complete(state: State) -> bool:
    expect: dict[str, int] = state.get("expect", {})
    if not state.get("sources") or len(expect) < int(state["sources"]):
        return False
    have: dict[str, int] = {}
    for by_source in state.get("totals", {}).values():
        for source in by_source:
            have[source] = have.get(source, 0) + 1
    return all(have.get(source, 0) == wanted for source, wanted in expect.items())


def final_step(topo: Topology, state: State, group: str, payload: dict[str, Any]) -> Step:
    """Tier 4, one group. State: each prefix's result; the answer once every prefix has reported."""
    if payload.get("kind") != "result":
        raise BadMessage(f"final: unknown message kind {payload.get('kind')!r}")
    parts: dict[str, dict[str, Any]] = state.setdefault("parts", {})
    note = "duplicate" if payload["prefix"] in parts else "result"
    parts[str(payload["prefix"])] = {k: payload[k] for k in ("top", "tags", "mentions")}
    if len(parts) < int(payload["prefixes"]):
        return Step(state, [], note)
    merged = {str(tag): int(count) for part in parts.values() for tag, count in part["top"]}
    answer = {
        "top": [list(item) for item in top_n(merged, topo.top)],
        "tags": sum(int(part["tags"]) for part in parts.values()),
        "mentions": sum(int(part["mentions"]) for part in parts.values()),
    }
    state["answer"] = answer
    return Step(state, [], "answer", result=answer)


StepFunction = Callable[[Topology, State, str, dict[str, Any]], Step]
TIERS: dict[str, StepFunction] = {
    "map": map_step,
    "summarise": summarise_step,
    "aggregate": aggregate_step,
    "final": final_step,
}
