"""Control addon: keeps the proxy's view of fences and token floors current from the core.

Construct once and hand `control.state` to the guards (`Fence`, `LeaseGuard`), which only read it.

Options:
- `strictq_control`: URL of the process holding the core (`https://host:port`; the stream's path
  `/admin/v1/control` is added unless given). Empty:
  standalone testing, the state counts as synchronised with no fences and no floors (`strictq serve`
  always passes one, so the embedded default never runs unguarded).
- `strictq_control_key`: secret of a `proxy` (or `admin`, `operator`) credential. Empty: the secret of
  `strictq_control_key_id`'s credential, or else of the key file's first `proxy`-role credential (the auth
  addon's `strictq_keys`). The key's tenant is the one tenant the proxy serves (the stream only tells it
  that tenant's fences and floors; fencing.addons.auth refuses other tenants' workers); an `operator` key
  serves every tenant.
- `strictq_control_key_id`: id of that key-file credential (`strictq proxy --control-key-id`).
- `strictq_control_ca`: PEM file trusted for the control URL (the core's CA); empty: the system store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader
from mitmproxy.utils import asyncio_utils

from access.permissions import CONTROL_ROLES, egress_identity
from fencing.control_client import ControlClient, ControlState

if TYPE_CHECKING:
    from access.keys import Credential, KeyRing

logger = logging.getLogger(__name__)

OPTIONS = ("strictq_control", "strictq_control_key", "strictq_control_key_id", "strictq_control_ca")
KEY_FILE_OPTION = "strictq_keys"  # declared by the auth addon
CONTROL_PATH = "/admin/v1/control"


def control_credential(ring: KeyRing, path: str, key_id: str = "") -> Credential:
    """The credential the proxy reads the control stream with: `key_id`'s, else the key file's first
    `proxy`-role credential (the proxy's own identity). OptionsError names what is missing."""
    if key_id:
        credential = ring.by_id(key_id)
        if credential is None:
            raise exceptions.OptionsError(f"strictq_control_key_id {key_id!r} is not a credential of {path}")
        if credential.role not in CONTROL_ROLES:
            raise exceptions.OptionsError(
                f"strictq_control_key_id {key_id!r} has role {credential.role}; the control stream needs "
                f"one of {', '.join(CONTROL_ROLES)}"
            )
        return credential
    for credential in ring.credentials:
        if egress_identity(credential):
            return credential
    raise exceptions.OptionsError(f"key file {path} has no credential of role proxy for the control stream")


def proxy_key_from_file(path: str, key_id: str = "") -> str:
    """The secret of the control-stream credential of the key file (`control_credential`)."""
    from access.keys import KeyFileError, KeyRing  # the key file's one parser

    try:
        ring = KeyRing.load(Path(path))
    except KeyFileError as exc:
        raise exceptions.OptionsError(str(exc)) from exc
    return control_credential(ring, path, key_id).secret


def control_stream_url(url: str) -> str:
    """`--control` names the process holding the core; its stream lives at CONTROL_PATH."""
    base = url.rstrip("/")
    return base if base.endswith(CONTROL_PATH) else base + CONTROL_PATH


class Control:
    """Runs the control-stream client as a task of the proxy's event loop and owns its state."""

    def __init__(self, state: ControlState | None = None) -> None:
        self.state = state if state is not None else ControlState()
        self.client: ControlClient | None = None
        self._settings: tuple[str, str, str | None] | None = None
        self._running = False
        self._swap_task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        """Whether a control stream is configured (False: standalone, synced with no fences)."""
        return self._settings is not None

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "strictq_control", str, "", "Control stream URL of the core; empty: standalone (no fences)."
        )
        loader.add_option(
            "strictq_control_key", str, "", "Proxy-role secret for the control stream; empty: the key file's."
        )
        loader.add_option(
            "strictq_control_key_id",
            str,
            "",
            "Id of the key-file credential (proxy, admin or operator) for the control stream; empty: the "
            "first proxy credential. Its tenant is the one the proxy serves (operator: all).",
        )
        loader.add_option("strictq_control_ca", str, "", "PEM file to trust for the control stream's TLS.")

    def configure(self, updated: set[str]) -> None:
        if not updated & {*OPTIONS, KEY_FILE_OPTION}:
            return
        url = ctx.options.strictq_control.strip()
        if not url:
            settings = None
        else:
            if not url.startswith(("http://", "https://")):
                raise exceptions.OptionsError(f"strictq_control must be http(s)://...: {url!r}")
            url = control_stream_url(url)
            key = ctx.options.strictq_control_key or self._key_from_file()
            ca = ctx.options.strictq_control_ca or None
            if ca is not None and not Path(ca).is_file():
                raise exceptions.OptionsError(f"strictq_control_ca {ca} is not a file")
            settings = (url, key, ca)
        if settings == self._settings and self.client is not None:
            return
        self._settings = settings
        if self._running:
            self._restart()
        elif settings is None:
            self._standalone()

    @staticmethod
    def _key_from_file() -> str:
        path = getattr(ctx.options, KEY_FILE_OPTION, "") if KEY_FILE_OPTION in ctx.options else ""
        if not path:
            raise exceptions.OptionsError(
                "strictq_control needs strictq_control_key, or strictq_keys with a proxy credential"
            )
        return proxy_key_from_file(path, ctx.options.strictq_control_key_id)

    def _standalone(self) -> None:
        """No core to ask: nothing is fenced and no floor is known (documented standalone mode)."""
        self.state.replace_fences([])
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
