"""The proxy's addons, one concern each, in the order every hook runs through them.

auth (who is calling: Proxy-Authorization, 407) → tagging (which message: X-Strictq-* tags, 400) →
redact (what may be written: the redacted request view and the request identity the guards match on) →
control (the control stream: fences and token floors) → fence (is the worker fenced? block: 403; mimic:
a verdict on the flow) → mimic (answers the calls with that verdict from recordings, or 503 unmatched;
also replay mode's answers) → lease_guard (409 stale lease, 503 unsynced) → capture (one wire-log record
per call, whatever happened) → admin (/healthz, /readyz, /metrics).

The order is the contract: each addon skips a call an earlier one answered (`flow.response` set), mimic
must come right after fence (it acts only on the fence's verdict, and a fenced call that nobody answers
would be forwarded), and capture after every guard. mitmproxy walks this list for every hook, so it holds
nothing else: no default addons.
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
    from fencing.addons.mimic import Mimic
    from fencing.addons.redact import Redact
    from fencing.addons.tagging import Tagging

    control = Control(runtime.control)
    return [
        Auth(runtime),
        Tagging(runtime),
        Redact(runtime),
        control,
        Fence(runtime.control),
        Mimic(runtime.control),
        LeaseGuard(runtime.control),
        Capture(runtime),
        Admin(runtime, control),
    ]
