"""The proxy's addons, one concern each, in the order every hook runs through them.

auth (who is calling: Proxy-Authorization, 407) → tagging (which message: X-Strictq-* tags, 400) →
redact (what may be written: the redacted request view and the request identity the guards match on) →
control (the control stream: fences and token floors) → fence (block / mimic a fenced worker) →
lease_guard (409 stale lease, 503 unsynced) → capture (one wire-log record per call, whatever happened)
→ admin (/healthz, /readyz, /metrics).

mitmproxy walks this list for every hook, so it holds nothing else: no default addons.
"""

from __future__ import annotations

from typing import Any

from fencing.runtime import ProxyRuntime


def ordered_addons(runtime: ProxyRuntime) -> list[Any]:
    """A fresh set of addons sharing `runtime`, in hook order."""
    from fencing.addons.admin import Admin
    from fencing.addons.auth import Auth
    from fencing.addons.capture import Capture
    from fencing.addons.control import Control
    from fencing.addons.fence import Fence
    from fencing.addons.lease_guard import LeaseGuard
    from fencing.addons.redact import Redact
    from fencing.addons.tagging import Tagging

    control = Control(runtime.control)
    return [
        Auth(runtime),
        Tagging(runtime),
        Redact(runtime),
        control,
        Fence(runtime.control),
        LeaseGuard(runtime.control),
        Capture(runtime),
        Admin(runtime, control),
    ]
