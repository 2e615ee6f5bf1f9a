"""What one proxy process's addons share besides the per-call `CallContext`: its name (the wire-log
writer id), the control state the guards read, counters for /metrics, and where the admin server
listens.

One object built by `fencing.master` and handed to `fencing.addons.ordered_addons`, so no addon has to
find another through mitmproxy's addon manager.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from fencing.control_client import ControlState


@dataclass(slots=True)
class ProxyRuntime:
    name: str = "proxy"  # this process: the wire-log writer id, the admin's /metrics "process"
    control: ControlState = field(default_factory=ControlState)
    # Counters for /metrics: "requests", "records", "action.<action>", "code.<code>", "status.<Nxx>", ...
    metrics: Counter[str] = field(default_factory=Counter)
    started_at: float = field(default_factory=time.time)
    admin_url: str | None = None  # set by the admin addon once it listens
    startup_errors: list[str] = field(default_factory=list)  # addons report what would make start-up fail
    in_flight: int = 0  # requests seen and not yet recorded (capture keeps it); a stop waits for them

    def count(self, key: str, n: int = 1) -> None:
        self.metrics[key] += n
