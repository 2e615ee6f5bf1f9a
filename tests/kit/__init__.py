"""The strictq testing kit, in the manner of `trio.testing`: one process launcher for the start-up
contract (`launch`), one poll-until (`until`, `until_sync`), one fake clock (`FakeClock`), one recording
fake backend (`Backend`). Test support modules build on these; none keeps a copy of its own."""

from kit.backend import Backend, SeenRequest
from kit.clock import T0, FakeClock
from kit.process import (
    ADMIN,
    CA,
    CLIENT_ENV,
    KEYS,
    LISTENING,
    PROXY_CA,
    ROOT,
    ChildProcess,
    launch,
    running,
    strictq,
)
from kit.until import until, until_sync

__all__ = [
    "ADMIN",
    "CA",
    "CLIENT_ENV",
    "KEYS",
    "LISTENING",
    "PROXY_CA",
    "ROOT",
    "T0",
    "Backend",
    "ChildProcess",
    "FakeClock",
    "SeenRequest",
    "launch",
    "running",
    "strictq",
    "until",
    "until_sync",
]
