"""Control addon: keeps the proxy's view of fences and token floors (stub, being filled in).

Construct once and hand `control.state` to `Fence` and `LeaseGuard`:
    control = Control(); Fence(control.state); LeaseGuard(control.state)
"""

from __future__ import annotations

from fencing.control_client import ControlState


class Control:
    """Runs the control-stream client and owns the `ControlState` the guards read."""

    def __init__(self, state: ControlState | None = None) -> None:
        self.state = state if state is not None else ControlState()
