"""Drain-style log templates (He et al., 2017), small and deterministic, for masked error texts.

Messages are split on spaces; a fixed-depth tree routes them by token count and first token to
clusters; a message joins the most similar cluster (share of equal tokens, `<*>` matching anything)
if that reaches `similarity`, and the differing positions become `<*>`. It runs on the driver over
the *distinct* masked texts Spark aggregated (with their counts), so it sees hundreds of lines, not
millions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WILDCARD = "<*>"


@dataclass(slots=True)
class Cluster:
    tokens: list[str]
    count: int = 0
    members: list[str] = field(default_factory=list)

    @property
    def template(self) -> str:
        return " ".join(self.tokens)


class Drain:
    def __init__(self, similarity: float = 0.5, max_children: int = 100) -> None:
        self.similarity = similarity
        self.max_children = max_children
        self._tree: dict[int, dict[str, list[Cluster]]] = {}
        self.clusters: list[Cluster] = []

    def add(self, message: str, count: int = 1) -> Cluster:
        tokens = message.split()
        first = tokens[0] if tokens else ""
        if any(ch.isdigit() for ch in first) or first.startswith("<"):
            first = WILDCARD
        by_first = self._tree.setdefault(len(tokens), {})
        if first not in by_first and len(by_first) >= self.max_children:
            first = WILDCARD
        candidates = by_first.setdefault(first, [])
        best, best_score = None, -1.0
        for cluster in candidates:
            score = self._score(cluster.tokens, tokens)
            if score > best_score:
                best, best_score = cluster, score
        if best is None or best_score < self.similarity:
            best = Cluster(list(tokens))
            candidates.append(best)
            self.clusters.append(best)
        else:
            best.tokens = [a if a == b else WILDCARD for a, b in zip(best.tokens, tokens, strict=True)]
        best.count += count
        best.members.append(message)
        return best

    @staticmethod
    def _score(template: list[str], tokens: list[str]) -> float:
        if not tokens:
            return 1.0
        same = sum(1 for a, b in zip(template, tokens, strict=True) if a == b or a == WILDCARD)
        return same / len(tokens)


def templates_for(messages: dict[str, int], similarity: float = 0.5) -> dict[str, str]:
    """Masked message -> its template; messages are fed most frequent first (stable templates)."""
    drain = Drain(similarity)
    for message, count in sorted(messages.items(), key=lambda item: (-item[1], item[0])):
        if message:
            drain.add(message, count)
    return {member: cluster.template for cluster in drain.clusters for member in cluster.members}
