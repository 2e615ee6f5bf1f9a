"""Durable fences: which workers the egress proxy must cut off, how, and until when.

A fence is an operator's (or the failure manager's) decision; the proxy only ever learns it from the
control stream. Losing one on a restart would silently let a fenced worker's side effects through, so a
change is on disk before it becomes visible to anyone: the API answer and the stream event both come
after it is durable.

Where: in the core's SQLite store (`StoreFenceRegistry`, table `fences`, written through the group commit
like every other effect), so fences, suspensions and blacklists share one durable place and one backup.
A `fences.json` left by an earlier version is migrated at start (read once, written to the store, renamed
`fences.json.migrated`); a damaged one still stops the start (`FenceFileError`). `FenceRegistry` alone
keeps the JSON file (one file, replaced atomically: write, fsync, rename, fsync the directory) for
callers without a store. A cluster's edges hold the cluster's one set in its control bucket
(cluster.control_fences.ClusterFenceRegistry).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import orjson

from protocol.errors import StrictqError
from wirelog.files import StartupError, private_dir, write_private

from .machine.effects import Effect, FenceSaved
from .machine.inputs import ControlRows

log = logging.getLogger("strictq.control")
MIGRATED_SUFFIX = ".migrated"
FenceMode = Literal["block", "mimic"]
MODES: tuple[FenceMode, ...] = ("block", "mimic")
MAX_REASON = 500
MAX_WORKER = 128
FILE_VERSION = 1


class FenceError(StrictqError):
    """A fence request the registry refuses; `code` is the stable machine-readable reason (docs/errors.md)."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidFence(FenceError):
    """Bad mode, reason, ttl or worker id (HTTP 400)."""


class UnknownWorker(FenceError):
    """The worker is not a `worker` credential of the key file (HTTP 404)."""

    status = 404
    code = "unknown_worker"


class NotFenced(FenceError):
    """Unfencing a worker that has no fence (HTTP 404)."""

    status = 404
    code = "not_fenced"


class FenceFileError(StartupError):
    """fences.json is unreadable or malformed: refuse to start rather than forget fences."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            path, problem, "fix it, restore it from a backup, or remove it to start with no fences"
        )


@dataclass(frozen=True, slots=True)
class Fence:
    """One worker's fence; times are float seconds since the epoch, `expires` None = until lifted."""

    worker: str
    mode: FenceMode
    reason: str
    since: float
    expires: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "mode": self.mode,
            "reason": self.reason,
            "since": self.since,
            "expires": self.expires,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Fence:
        if not isinstance(data, dict):
            raise ValueError("a fence must be a JSON object")
        worker, mode, reason = data.get("worker"), data.get("mode"), data.get("reason")
        since, expires = data.get("since"), data.get("expires")
        validate_fence(worker, mode, reason, None)
        if isinstance(since, bool) or not isinstance(since, int | float):
            raise ValueError("since must be a number")
        if expires is not None and (isinstance(expires, bool) or not isinstance(expires, int | float)):
            raise ValueError("expires must be a number or null")
        return cls(
            cast(str, worker),
            cast(FenceMode, mode),
            cast(str, reason),
            float(since),
            None if expires is None else float(expires),
        )


def validate_fence(worker: Any, mode: Any, reason: Any, ttl: Any) -> None:
    """The one check of fence input, shared by the HTTP API, the Python API and the file loader."""
    if not isinstance(worker, str) or not worker or len(worker) > MAX_WORKER or not worker.isprintable():
        raise InvalidFence(f"worker must be 1-{MAX_WORKER} printable characters", "bad_worker")
    if mode not in MODES:
        raise InvalidFence(f"mode must be one of {', '.join(MODES)}", "bad_mode")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidFence("reason must be a non-empty string", "bad_reason")
    if len(reason) > MAX_REASON:
        raise InvalidFence(f"reason must be at most {MAX_REASON} characters", "bad_reason")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0
    ):
        raise InvalidFence("ttl must be a positive number of seconds (or absent: no expiry)", "bad_ttl")


class FenceRegistry:
    """The fence set in memory, mirrored in `path`; every change is written durably before it applies.

    Changes are serialised by one lock, so the file always holds the state the last change produced and
    callers see changes in the order they were written.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fences: dict[str, Fence] = {}
        self._lock = asyncio.Lock()
        # Told of changes that did not come through `put`/`remove` here: another process made them (a
        # cluster's other edges, its failure management; cluster.control_fences), as (worker, the fence
        # before, the fence now; None: none). Called with `lock` held, after the change applies.
        self.listeners: list[Callable[[str, Fence | None, Fence | None], None]] = []

    def load(self) -> None:
        """Read the file left by an earlier run (none yet: no fences)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._fences = {}
            return
        except OSError as exc:
            raise FenceFileError(self.path, f"cannot read it ({exc.strerror or exc})") from exc
        try:
            data = orjson.loads(raw)
            if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
                raise ValueError(f"expected an object with version {FILE_VERSION}")
            entries = data.get("fences")
            if not isinstance(entries, list):
                raise ValueError("fences must be a list")
            fences = [Fence.from_dict(entry) for entry in entries]
        except (orjson.JSONDecodeError, ValueError, FenceError) as exc:
            raise FenceFileError(self.path, f"malformed ({exc})") from exc
        self._fences = {fence.worker: fence for fence in fences}

    @property
    def fences(self) -> Mapping[str, Fence]:
        """The current fences by worker (read-only view)."""
        return self._fences

    def get(self, worker: str) -> Fence | None:
        return self._fences.get(worker)

    def sorted(self) -> list[Fence]:
        return [self._fences[w] for w in sorted(self._fences)]

    def next_expiry(self) -> float | None:
        times = [f.expires for f in self._fences.values() if f.expires is not None]
        return min(times) if times else None

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a change is written; the hub emits its event under it, so events follow the file."""
        return self._lock

    async def put(self, fence: Fence) -> None:
        """Add or replace a worker's fence (caller holds `lock`)."""
        changed = {**self._fences, fence.worker: fence}
        await self._write(changed)
        self._fences = changed

    async def remove(self, worker: str) -> Fence:
        """Lift a worker's fence (caller holds `lock`); NotFenced if it has none."""
        fence = self._fences.get(worker)
        if fence is None:
            raise NotFenced(f"worker {worker!r} is not fenced")
        changed = {w: f for w, f in self._fences.items() if w != worker}
        await self._write(changed)
        self._fences = changed
        return fence

    async def _write(self, fences: dict[str, Fence]) -> None:
        data = orjson.dumps(
            {"version": FILE_VERSION, "fences": [fences[w].to_dict() for w in sorted(fences)]},
            option=orjson.OPT_INDENT_2,
        )
        # A thread: fsync can take milliseconds, and the core shares this event loop.
        await asyncio.to_thread(_replace_file, self.path, data)


class StoreFenceRegistry(FenceRegistry):
    """Fences in the core's store: `persist` submits effects to the group commit and resolves once they
    are durable; `saved` is what the store held when it opened. `path` is the legacy fences.json to
    migrate (read once at `load`, then renamed `*.migrated`)."""

    def __init__(
        self,
        path: str | Path,
        persist: Callable[[Sequence[Effect]], Awaitable[object]],
        saved: Callable[[], ControlRows],
    ) -> None:
        super().__init__(path)
        self._persist = persist
        self._saved = saved
        self._legacy: dict[str, Fence] = {}  # read from a legacy file by load(), written by migrate()

    def load(self) -> None:
        """The fences the store kept. A legacy file is read here (FenceFileError if damaged) and merged
        in by `migrate`, which the hub awaits right after."""
        stored: dict[str, Fence] = {}
        for worker, data in self._saved().fences.items():
            try:
                stored[worker] = Fence.from_dict(data)
            except (ValueError, FenceError) as exc:  # the store only ever holds what validate_fence passed
                log.error("ignoring an unreadable fence of %s in the store: %s", worker, exc)
        self._legacy = {}
        if self.path.exists():
            super().load()  # FenceFileError for a damaged file: start-up fails, as before
            self._legacy = {w: f for w, f in self._fences.items() if w not in stored}
        self._fences = {**stored, **self._legacy}

    async def migrate(self) -> int:
        """Write the legacy file's fences to the store, then rename the file; returns how many moved."""
        legacy = self._legacy
        if legacy:
            await self._persist([FenceSaved(w, f.to_dict()) for w, f in sorted(legacy.items())])
        if self.path.exists():
            target = self.path.with_name(self.path.name + MIGRATED_SUFFIX)
            await asyncio.to_thread(os.replace, self.path, target)
            log.info("migrated %d fence(s) from %s to the store (renamed %s)", len(legacy), self.path, target)
        self._legacy = {}
        return len(legacy)

    async def _write(self, fences: dict[str, Fence]) -> None:
        changes: list[Effect] = [
            FenceSaved(worker, fence.to_dict())
            for worker, fence in fences.items()
            if self._fences.get(worker) != fence
        ]
        changes.extend(FenceSaved(worker, None) for worker in self._fences if worker not in fences)
        if changes:
            await self._persist(changes)


def _replace_file(path: Path, data: bytes) -> None:
    """Write-then-rename, so a crash leaves either the old file or the new one, never a torn one; the
    file is 0600 from its creation (wirelog.files), in a 0700 directory when this creates it."""
    private_dir(path.parent)
    write_private(path, data)
