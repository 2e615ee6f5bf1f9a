"""The raw stream: generated, seeded social-media posts with hashtags, one JSON object a line.

A post is `{"id", "author", "text"}`; its hashtags are what `spark.topn.HASHTAG_PATTERN` finds in the
lower-cased text, each counted once per post (a post that says `#Rust ... #rust!` mentions `rust` once).
Both sides of the check (the tiers and the Spark job) read the same file and apply that one definition;
the generator writes the awkward cases on purpose (mixed case, trailing punctuation, a tag repeated in a
post, `##double`, a bare `#`) so that a difference in extraction would show.

Popularity is Zipf-like (weight 1 / rank**s over a fixed vocabulary), so there is a clear head and a long
tail; some posts have no hashtag, some several.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from spark.topn import HASHTAG_PATTERN, rank_key

_HASHTAG = re.compile(HASHTAG_PATTERN)
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "xi", "da", "be", "fo", "gu")
WORDS = ("the", "queue", "is", "strict", "today", "look", "at", "this", "new", "order", "why", "so", "fast")
TAGS_PER_POST = (0, 1, 1, 1, 2, 2, 3)  # drawn uniformly: ~1/7 none, some several


def hashtags(text: str) -> list[str]:
    """The distinct hashtags of a post, in order of first appearance (lower-cased, without the `#`)."""
    return list(dict.fromkeys(_HASHTAG.findall(text.lower())))


def top_n(counts: dict[str, int], n: int) -> list[tuple[str, int]]:
    """The `n` most mentioned tags: by count descending, ties by tag ascending (as the Spark job)."""
    return sorted(counts.items(), key=lambda item: rank_key(*item))[:n]


@dataclass(frozen=True, slots=True)
class Post:
    id: str
    author: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "author": self.author, "text": self.text}


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """What to generate: `posts` posts over `vocabulary` tags with Zipf exponent `skew`, `authors` authors."""

    posts: int = 20_000
    vocabulary: int = 400
    skew: float = 1.1
    authors: int = 500
    seed: int = 18


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """`size` distinct tag names made of syllables (with a digit or underscore now and then)."""
    names: dict[str, None] = {}
    while len(names) < size:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        if rng.random() < 0.15:
            name += rng.choice(("_", "")) + str(rng.randint(0, 99))
        names[name] = None
    return list(names)


def generate(spec: StreamSpec) -> Iterator[Post]:
    """The posts of `spec`, deterministic for its seed."""
    rng = random.Random(spec.seed)
    tags = vocabulary(spec.vocabulary, rng)
    weights = [1 / (rank**spec.skew) for rank in range(1, len(tags) + 1)]
    for i in range(spec.posts):
        chosen = rng.choices(tags, weights, k=rng.choice(TAGS_PER_POST))
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 8))]
        for tag in chosen:
            words.insert(rng.randint(0, len(words)), _spelling(tag, rng))
        if rng.random() < 0.05:
            words.append("#")  # a bare '#': no tag
        author = f"u{rng.randrange(spec.authors):04d}"
        yield Post(f"p{i:07d}", author, " ".join(words))


def _spelling(tag: str, rng: random.Random) -> str:
    """How a post writes a tag: mostly plain; sometimes capitalised, shouted, punctuated, doubled."""
    roll = rng.random()
    if roll < 0.1:
        text = "#" + tag.capitalize()
    elif roll < 0.15:
        text = "#" + tag.upper()
    elif roll < 0.2:
        text = "##" + tag
    else:
        text = "#" + tag
    if rng.random() < 0.1:
        text += rng.choice(("!", ",", ".", "?", ":)"))
    if rng.random() < 0.05:
        text += " and again #" + tag  # the same tag twice in one post: one mention
    return text


def write_stream(path: Path, posts: Iterable[Post]) -> int:
    """Write the posts as JSON lines; the count written."""
    count = 0
    with path.open("wb") as out:
        for post in posts:
            out.write(orjson.dumps(post.to_json()) + b"\n")
            count += 1
    return count


def read_stream(path: Path) -> Iterator[Post]:
    with path.open("rb") as lines:
        for line in lines:
            if line.strip():
                raw = orjson.loads(line)
                yield Post(str(raw["id"]), str(raw["author"]), str(raw["text"]))


def count_hashtags(posts: Iterable[Post]) -> Counter[str]:
    """Mentions per tag straight from the posts (the tests' plain-Python reference)."""
    counts: Counter[str] = Counter()
    for post in posts:
        counts.update(hashtags(post.text))
    return counts
