"""Masks for non-deterministic fields: what replay ignores when it matches and compares calls.

A new worker version that puts a timestamp or a random id into a request body would diverge on every
call, and its calls would never match a recording. Masks replace such values by `<masked>` on both sides
before bodies are hashed, matched and compared:

- JSON paths (a small, predictable subset): `$.sent_at`, `$.items[*].id`, `$.items[0].ts`, `$.*.ts`,
  `$..request_id` (that name at any depth), `$['odd key']`; `$` alone masks the whole body.
- Regular expressions, applied to the body text (after the JSON paths) and to the URL's path and query;
  every match is replaced.

A body the masks do not change keeps its bytes and its recorded hash, so without masks replay matches
exactly as the proxy's mimicry does. Changed JSON is re-serialised with sorted keys, so equal masked
documents hash alike whatever their key order.

Config file (TOML or JSON; a top-level `mask` table is used when present):

    json_paths = ["$.sent_at", "$..request_id"]
    regexes = ["\\\\d{4}-\\\\d{2}-\\\\d{2}T[0-9:.]+Z"]
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

MASK = "<masked>"
_STEP = re.compile(
    r"""\.\.(?P<descend>[A-Za-z0-9_\-]+)
      | \.(?P<key>[A-Za-z0-9_\-]+|\*)
      | \[(?P<index>-?\d+|\*)\]
      | \[(?P<quote>['"])(?P<quoted>.*?)(?P=quote)\]""",
    re.VERBOSE,
)

Step = tuple[str, Any]  # ("key", name) | ("any", None) | ("index", n) | ("descend", name)


class MaskError(ValueError):
    """A mask that cannot be used (bad JSON path, bad regex, unreadable file); the message says which."""


@dataclass(frozen=True, slots=True)
class MaskConfig:
    json_paths: tuple[str, ...] = ()
    regexes: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: Path) -> MaskConfig:
        """From TOML or JSON (by suffix; JSON when it starts with `{`)."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise MaskError(f"cannot read mask config {path}: {exc}") from exc
        try:
            data = json.loads(text) if path.suffix == ".json" or text.lstrip().startswith("{") else None
            if data is None:
                data = tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise MaskError(f"{path}: not valid TOML or JSON: {exc}") from exc
        if isinstance(data, dict) and isinstance(data.get("mask"), dict):
            data = data["mask"]
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "mask config") -> MaskConfig:
        if not isinstance(data, dict):
            raise MaskError(f"{source}: expected a table with json_paths and regexes")
        unknown = set(data) - {"json_paths", "regexes"}
        if unknown:
            raise MaskError(f"{source}: unknown key(s) {', '.join(sorted(unknown))} (json_paths, regexes)")
        lists = []
        for key in ("json_paths", "regexes"):
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise MaskError(f"{source}: {key} must be a list of non-empty strings")
            lists.append(tuple(value))
        config = cls(*lists)
        Masker(config)  # validate now, naming the file
        return config

    def merged(self, other: MaskConfig) -> MaskConfig:
        return MaskConfig(
            tuple(dict.fromkeys((*self.json_paths, *other.json_paths))),
            tuple(dict.fromkeys((*self.regexes, *other.regexes))),
        )

    def to_dict(self) -> dict[str, list[str]]:
        return {"json_paths": list(self.json_paths), "regexes": list(self.regexes)}

    @property
    def empty(self) -> bool:
        return not self.json_paths and not self.regexes


def parse_path(path: str) -> list[Step]:
    """`$.a[*].b` -> steps; MaskError when the path is outside the supported subset."""
    text = path.strip()
    if not text.startswith("$"):
        raise MaskError(f"JSON path {path!r} must start with '$'")
    steps: list[Step] = []
    position = 1
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None:
            raise MaskError(
                f"JSON path {path!r}: cannot read from {text[position:]!r} "
                "(supported: .name, .*, ..name, [n], [*], ['name'])"
            )
        if match["descend"] is not None:
            steps.append(("descend", match["descend"]))
        elif match["key"] is not None:
            steps.append(("any", None) if match["key"] == "*" else ("key", match["key"]))
        elif match["index"] is not None:
            steps.append(("any", None) if match["index"] == "*" else ("index", int(match["index"])))
        else:
            steps.append(("key", match["quoted"]))
        position = match.end()
    return steps


@dataclass
class Masker:
    """Applies a MaskConfig. Stateless after construction."""

    config: MaskConfig = field(default_factory=MaskConfig)

    def __post_init__(self) -> None:
        self._paths = [parse_path(p) for p in self.config.json_paths]
        self._regexes: list[re.Pattern[str]] = []
        for pattern in self.config.regexes:
            try:
                self._regexes.append(re.compile(pattern))
            except re.error as exc:
                raise MaskError(f"mask regex {pattern!r}: {exc}") from exc

    @property
    def active(self) -> bool:
        return bool(self._paths or self._regexes)

    def text(self, value: str) -> str:
        """A URL path or query with every regex match masked."""
        for regex in self._regexes:
            value = regex.sub(MASK, value)
        return value

    def body(self, data: bytes) -> bytes:
        """The body with JSON paths and regexes masked; the very same object when nothing changed."""
        if not data or not self.active:
            return data
        out = data
        if self._paths and data.lstrip()[:1] in (b"{", b"["):
            try:
                document = _loads(data)
            except ValueError:
                document = None
            if document is not None:
                changed = False
                for steps in self._paths:
                    document, hit = _apply(document, steps, 0)
                    changed = changed or hit
                if changed:
                    out = _dumps(document)
        if self._regexes:
            text = out.decode("utf-8", "surrogateescape")
            masked = self.text(text)
            if masked != text:
                out = masked.encode("utf-8", "surrogateescape")
        return out

    def body_sha256(self, data: bytes | None, recorded: str | None) -> str:
        """The hash calls are matched and compared on: of the masked body when it was kept and the masks
        changed it, else the recorded hash (a metadata-level record cannot be masked)."""
        if data is not None and self.active:
            masked = self.body(data)
            if masked is not data:
                return hashlib.sha256(masked).hexdigest()
        if recorded is not None:
            return recorded
        return hashlib.sha256(data or b"").hexdigest()


def _apply(node: Any, steps: list[Step], index: int) -> tuple[Any, bool]:
    """Mask what `steps[index:]` selects below `node`; returns the (copied where changed) node."""
    if index == len(steps):
        return MASK, True
    kind, arg = steps[index]
    if kind == "key":
        if isinstance(node, dict) and arg in node:
            value, changed = _apply(node[arg], steps, index + 1)
            return ({**node, arg: value}, True) if changed else (node, False)
        return node, False
    if kind == "index":
        if isinstance(node, list) and -len(node) <= arg < len(node):
            value, changed = _apply(node[arg], steps, index + 1)
            if changed:
                copy = list(node)
                copy[arg] = value
                return copy, True
        return node, False
    if kind == "any":
        return _each(node, lambda item: _apply(item, steps, index + 1))

    # descend: the name at any depth below here, then the rest of the path from there
    def visit(item: Any) -> tuple[Any, bool]:
        return _apply(item, steps, index)

    if isinstance(node, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, value in node.items():
            new, hit = _apply(value, steps, index + 1) if key == arg else visit(value)
            out[key] = new
            changed = changed or hit
        return (out, True) if changed else (node, False)
    return _each(node, visit) if isinstance(node, list) else (node, False)


def _each(node: Any, apply: Any) -> tuple[Any, bool]:
    if isinstance(node, dict):
        results = {key: apply(value) for key, value in node.items()}
        if any(hit for _, hit in results.values()):
            return {key: value for key, (value, _) in results.items()}, True
        return node, False
    if isinstance(node, list):
        items = [apply(item) for item in node]
        if any(hit for _, hit in items):
            return [value for value, _ in items], True
    return node, False


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # integers beyond 64 bits; ValueError when it is not JSON at all


def _dumps(document: Any) -> bytes:
    try:
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
