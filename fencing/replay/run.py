"""What one replay run is: its settings, its result and how it fails, and the `Runner` that carries it out.

The runner composes an isolated stack (queue core, gateway, this proxy in replay mode, the worker): that
composition is strictq's (strictq.replay_stack), above the gateway and the proxy both; the replay session
(fencing.replay.session) only needs this contract.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencing.replay.stories import MessageStory


class RunError(Exception):
    """The run could not be set up (worker command cannot start or exits before it takes any message,
    proxy did not start); the message says why. `strictq replay` exits 2 (could not run), never 1 (a
    divergence)."""


@dataclass(slots=True)
class RunSettings:
    name: str  # "candidate" | "baseline": names the run directory and logs
    command: list[str]
    recording: Path  # wire-log directory the proxy answers from
    work_dir: Path  # kept: wirelog/, worker.log, proxy.log
    key_dir: Path  # directory of the recording's redaction.key
    redaction: Path | None = None
    mask_file: Path | None = None
    attempts: int = 1
    message_timeout: float = 30.0
    timeout: float = 300.0
    grace: float = 5.0


@dataclass(slots=True)
class RunResult:
    name: str
    command: list[str]
    wirelog: Path
    worker_log: Path
    proxy_log: Path
    started_at: float
    finished_at: float = 0.0
    worker_exit: int | None = None
    # message id -> ack | fail | timeout | not-replayed
    outcomes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": shlex.join(self.command),
            "wirelog": str(self.wirelog),
            "worker_log": str(self.worker_log),
            "proxy_log": str(self.proxy_log),
            "seconds": round(self.finished_at - self.started_at, 3),
            "worker_exit": self.worker_exit,
            "notes": self.notes,
        }


Progress = Callable[[str, str], None]  # (message id, outcome) when a message is done
# One isolated run: settings, the selected messages in original order, progress; raises RunError when the
# run cannot start at all.
Runner = Callable[[RunSettings, "list[MessageStory]", Progress | None], Awaitable[RunResult]]
