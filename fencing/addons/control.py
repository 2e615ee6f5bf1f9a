"""Control addon: keeps the proxy's view of fences and token floors current from the core.

Construct once and hand `control.state` to the guards (`Fence`, `LeaseGuard`), which only read it.

Options:
- `control_url`: the core's control stream (`https://host:port/admin/v1/control`). Empty: standalone
  testing, the state counts as synchronised with no fences and no floors (`strictq serve` and
  `strictq proxy` always pass one, so production never runs unguarded by accident).
- `control_key`: secret of a `proxy` (or `admin`) credential. Empty: the first `proxy`-role credential
  of the key file (option `control_keys`, or the auth addon's key-file option when declared).
- `control_ca`: PEM file trusted for the control URL (the core's CA); empty: the system store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from mitmproxy import ctx, exceptions
from mitmproxy.utils import asyncio_utils

from fencing.control_client import ControlClient, ControlState

logger = logging.getLogger(__name__)

OPTIONS = ("control_url", "control_key", "control_ca", "control_keys")
# Key-file options other addons may declare; read when control_keys is empty.
KEY_FILE_OPTIONS = ("keys", "keys_file", "key_file", "proxy_keys")


def proxy_key_from_file(path: str) -> str:
    """The secret of the key file's first `proxy`-role credential (the proxy's own identity)."""
    from gateway.keys import KeyFileError, KeyRing  # the gateway's parser is the key file's schema

    try:
        ring = KeyRing.load(Path(path))
    except KeyFileError as exc:
        raise exceptions.OptionsError(str(exc)) from exc
    for credential in ring.credentials:
        if credential.role == "proxy":
            return credential.secret
    raise exceptions.OptionsError(f"key file {path} has no credential of role proxy for the control stream")


class Control:
    """Runs the control-stream client as a task of the proxy's event loop and owns its state."""

    def __init__(self, state: ControlState | None = None) -> None:
        self.state = state if state is not None else ControlState()
        self.client: ControlClient | None = None
        self._settings: tuple[str, str, str | None] | None = None
        self._running = False
        self._swap_task: asyncio.Task[None] | None = None

    def load(self, loader) -> None:  # type: ignore[no-untyped-def]
        loader.add_option("control_url", str, "", "Control stream URL of the core; empty: standalone.")
        loader.add_option("control_key", str, "", "Secret of a proxy-role credential for the control stream.")
        loader.add_option("control_ca", str, "", "PEM file to trust for the control stream's TLS.")
        loader.add_option("control_keys", str, "", "Key file to take the proxy-role credential from.")

    def configure(self, updated: set[str]) -> None:
        if not updated & {*OPTIONS, *KEY_FILE_OPTIONS}:
            return
        url = ctx.options.control_url.strip()
        if not url:
            settings = None
        else:
            if not url.startswith(("http://", "https://")):
                raise exceptions.OptionsError(f"control_url must be http(s)://...: {url!r}")
            key = ctx.options.control_key or self._key_from_files()
            ca = ctx.options.control_ca or None
            if ca is not None and not Path(ca).is_file():
                raise exceptions.OptionsError(f"control_ca {ca} is not a file")
            settings = (url, key, ca)
        if settings == self._settings and self.client is not None:
            return
        self._settings = settings
        if self._running:
            self._restart()
        elif settings is None:
            self._standalone()

    def _key_from_files(self) -> str:
        for name in ("control_keys", *KEY_FILE_OPTIONS):
            path = getattr(ctx.options, name, None) if name in ctx.options else None
            if isinstance(path, str) and path:
                return proxy_key_from_file(path)
        raise exceptions.OptionsError("control_url needs control_key or a key file with a proxy credential")

    def _standalone(self) -> None:
        """No core to ask: nothing is fenced and no floor is known (documented standalone mode)."""
        self.state.fences.clear()
        self.state.mark_synced()

    def _restart(self) -> None:
        """Swap clients in order (old one fully stopped first) so two never write one state at once."""
        previous = self._swap_task
        self._swap_task = asyncio_utils.create_task(
            self._swap(previous), name="strictq control stream (re)start", keep_ref=True
        )

    async def _swap(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        old, self.client = self.client, None
        if old is not None:
            await old.stop()
        if self._settings is None:
            self._standalone()
            return
        url, key, ca = self._settings
        self.state.mark_unsynced()
        self.client = ControlClient(url, key, ca_file=ca, state=self.state)
        self.client.start()

    def running(self) -> None:
        self._running = True
        self._restart()

    async def done(self) -> None:
        self._running = False
        if self._swap_task is not None:
            with contextlib.suppress(Exception):
                await self._swap_task
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.stop()
