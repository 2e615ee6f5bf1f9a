"""Per-group local state of a tier's worker, and the checkpoints that keep it when the worker goes away.

`GroupStates` is the worker's local state: a `dict[group, state]` (each state a small JSON object that the
tier's step function owns), with `export(groups) -> bytes` and `import_(blob)`. These two are the seam for
the SDK's state transfer (issue 18: moving a group range between workers exports the old worker's state for
those groups and imports it into the new one); until it is wired, `Checkpoints` carries the state from
worker to worker instead: after each message a worker saves its group's exported state, fenced by the
claim's token, and a worker that claims a group it does not hold (or holds under an older claim) imports
the latest saved state first. That is the patent's "saved local state goes to another worker of the same
tier with the group assignment", and it survives a stopped worker and a lost claim alike.

Fencing: the queue issues every claim a fencing token greater than any before it, so a save carries the
token of the claim it was made under and is refused when a newer claim has saved already (a worker whose
claim expired cannot overwrite its successor's state). Checkpoints live in one SQLite file per run
(WAL; a save is one upsert), shared by the tiers' workers, in-process or not.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

State = dict[str, Any]


class GroupStates:
    """One worker's local state per group (`tier` names whose states they are: an import checks it)."""

    def __init__(self, tier: str) -> None:
        self.tier = tier
        self._states: dict[str, State] = {}

    def __contains__(self, group: object) -> bool:
        return group in self._states

    def groups(self) -> list[str]:
        return sorted(self._states)

    def get(self, group: str) -> State:
        """A copy of the group's state ({} when it has none): a step works on it, `put` commits it."""
        return copy.deepcopy(self._states.get(group, {}))

    def put(self, group: str, state: State) -> None:
        self._states[group] = state

    def drop(self, groups: Iterable[str]) -> None:
        for group in groups:
            self._states.pop(group, None)

    def export(self, groups: Iterable[str]) -> bytes:
        """The states of `groups` (those it holds) as one blob for `import_` on another worker."""
        held = {g: self._states[g] for g in groups if g in self._states}
        return orjson.dumps({"tier": self.tier, "groups": held}, option=orjson.OPT_SORT_KEYS)

    def import_(self, blob: bytes) -> list[str]:
        """Take over the states in `blob` (replacing any held for those groups); the groups imported."""
        raw = orjson.loads(blob)
        if (
            not isinstance(raw, dict)
            or raw.get("tier") != self.tier
            or not isinstance(raw.get("groups"), dict)
        ):
            raise ValueError(f"not a state export of tier {self.tier!r}")
        states: dict[str, State] = raw["groups"]
        self._states.update(states)
        return sorted(states)


@dataclass(frozen=True, slots=True)
class Saved:
    token: int  # the fencing token of the claim the save was made under
    worker: str  # who saved it
    blob: bytes  # GroupStates.export([group])


class Checkpoints:
    """Saved group states per (tier, group): the newest claim's save wins, older claims' saves are refused."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a stopped worker, not a lost machine, is the case
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (tier TEXT NOT NULL, grp TEXT NOT NULL,"
            " token INTEGER NOT NULL, worker TEXT NOT NULL, blob BLOB NOT NULL, PRIMARY KEY (tier, grp))"
        )
        self.saves = 0
        self.refused = 0

    def close(self) -> None:
        self._db.close()

    def save(self, tier: str, group: str, token: int, worker: str, blob: bytes) -> bool:
        """Save `blob` as the group's state under claim `token`; False if a newer claim saved already."""
        cursor = self._db.execute(
            "INSERT INTO checkpoints (tier, grp, token, worker, blob) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (tier, grp) DO UPDATE SET token = excluded.token, worker = excluded.worker,"
            " blob = excluded.blob WHERE excluded.token >= checkpoints.token",
            (tier, group, token, worker, blob),
        )
        if cursor.rowcount == 1:
            self.saves += 1
            return True
        self.refused += 1
        return False

    def load(self, tier: str, group: str) -> Saved | None:
        row = self._db.execute(
            "SELECT token, worker, blob FROM checkpoints WHERE tier = ? AND grp = ?", (tier, group)
        ).fetchone()
        return None if row is None else Saved(int(row[0]), str(row[1]), bytes(row[2]))
