"""A leaner per-request path through mitmproxy 12.2.3 for the egress proxy process.

Profiled under load (docs/profiles/proxy-before-*.svg, py-spy; docs/proxy-performance.md), most of the
proxy's CPU per request is mitmproxy's own machinery, not our addons. Four costs had nothing to do with
proxying and are removed here, each keeping mitmproxy's behaviour:

- `MessageData.__post_init__`: a run-time type check of every field of every request and response
  (`dataclasses.fields` + `typecheck.check_option_type` x 12), ~10% of the CPU. mitmproxy guards it with
  `if __debug__` (it is gone under `python -O`); the messages are built by mitmproxy's own parsers.
- `asyncio_utils.set_task_debug_info`: per hook task an `os.environ` lookup (a test-name suffix for
  debugging, only meaningful under pytest) besides naming the task; ~2%. The name and the creation time,
  which `task_repr` shows, are still set.
- `ProxyConnectionHandler.handle_hook`: the watchdog's `@contextmanager` (a generator per hook) and
  `Hook.args()` (`dataclasses.fields` each time, three times per hook). Same steps, no generator, the
  argument names cached per hook class.
- `AddonManager.handle_lifecycle` + `trigger_event` (`install_hook_cache`): every addon walked per hook,
  then again with an `update` hook that no addon of ours implements.
- `_Option.current`: two `copy.deepcopy` per option read, and the HTTP layer reads several per request;
  an immutable value (None, bool, int, float, str, bytes) is returned as is, which is what deepcopy
  returns for those anyway.
- `ConnectionHandler.server_event`: one `write` (a `send` syscall, and a packet for the peer to read) per
  `SendData` command, so a response's head and body went out in two. The bytes of one event for one TCP
  connection are joined into one write, in order, flushed before that connection is closed and before
  the event's handling ends (UDP keeps one write per datagram). A blocking hook that no addon
  implements (`responseheaders` on every request) is completed in the same pass instead of by a task
  that waits for the handler's lock to say so.

The patches replace mitmproxy internals, so they are tied to the pinned version (pyproject.toml): with
any other version `install()` leaves mitmproxy as it is and logs one warning.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from mitmproxy import exceptions, flow, hooks, http, optmanager, version
from mitmproxy.addonmanager import AddonManager
from mitmproxy.proxy import commands, events, mode_servers, server
from mitmproxy.utils import asyncio_utils

log = logging.getLogger("strictq.proxy")
mitm_log = logging.getLogger("mitmproxy.addonmanager")  # where mitmproxy logs addon errors

PATCHED_VERSION = "12.2.3"
_installed: list[bool] = []
_ARG_NAMES: dict[type, tuple[str, ...]] = {}
HANDLERS_ATTR = "strictq_handlers_of"  # on the AddonManager: hook -> the callables that implement it
_UPDATE = hooks.UpdateHook([])  # names the `update` hook in handler lookups


def hook_args(hook: hooks.Hook) -> list[Any]:
    """`Hook.args()` with the dataclass field names looked up once per hook class."""
    names = _ARG_NAMES.get(type(hook))
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(hook))  # type: ignore[arg-type]
        _ARG_NAMES[type(hook)] = names
    return [getattr(hook, name) for name in names]


def install() -> bool:
    """Patch mitmproxy's process-wide hot spots (idempotent). False when the version is not the pinned one."""
    if _installed:
        return _installed[0]
    if version.VERSION != PATCHED_VERSION:
        log.warning(
            "mitmproxy %s is not %s: the proxy runs without its fast path (slower, same behaviour)",
            version.VERSION,
            PATCHED_VERSION,
        )
        _installed.append(False)
        return False
    # Replacing library methods is the point of this module; mypy forbids assigning to them.
    http.MessageData.__post_init__ = _no_type_check  # type: ignore[method-assign]
    asyncio_utils.set_task_debug_info = _set_task_debug_info
    mode_servers.ProxyConnectionHandler.handle_hook = _handle_hook  # type: ignore[method-assign]
    optmanager._Option.current = _option_current  # type: ignore[method-assign]
    server.ConnectionHandler.server_event = _server_event  # type: ignore[method-assign]
    _installed.append(True)
    return True


def _no_type_check(self: object) -> None:
    """mitmproxy's `__post_init__` body runs only `if __debug__`; this is that check compiled out."""


def _set_task_debug_info(
    task: asyncio.Task[Any], *, name: str, client: tuple[Any, ...] | None = None
) -> None:
    """mitmproxy's, without the per-task environment lookup of the pytest test name."""
    task.created = time.time()  # type: ignore[attr-defined]
    task.set_name(name)
    if client:
        task.client = client  # type: ignore[attr-defined]


async def _handle_hook(self: Any, hook: Any) -> None:
    """`ProxyConnectionHandler.handle_hook` of 12.2.3 with its watchdog context manager inlined."""
    watchdog = self.timeout_watchdog
    watchdog.can_timeout.clear()
    watchdog.blocker += 1
    try:
        (data,) = hook_args(hook)  # mitmproxy supports single-argument hooks only
        await self.master.addons.handle_lifecycle(hook)
        if isinstance(data, flow.Flow) and data.intercepted:
            await data.wait_for_resume()  # type: ignore[no-untyped-call]
    finally:
        watchdog.blocker -= 1
        if watchdog.blocker == 0:
            watchdog.register_activity()
            watchdog.can_timeout.set()


_IMMUTABLE = frozenset({type(None), bool, int, float, str, bytes})


def _option_current(self: Any) -> Any:
    """`_Option.current` of 12.2.3: the value (or default) deep-copied, without the copy for immutables."""
    value = self._default if self.value is optmanager.unset else self.value
    if type(value) in _IMMUTABLE:
        return value
    return copy.deepcopy(value)


async def _server_event(self: Any, event: Any) -> None:
    """`ConnectionHandler.server_event` of 12.2.3, with one write per TCP connection per event, and the
    hooks no addon implements completed in place (see `_nobody_handles`)."""
    async with self._server_event_lock:
        # No `await` beyond this point (see mitmproxy's comment on reentrancy with eager tasks).
        self.timeout_watchdog.register_activity()
        pending: dict[Any, list[bytes]] = {}  # TCP connection -> chunks not yet written, in order
        queue = collections.deque([event])
        try:
            while queue:
                layer_commands = self.layer.handle_event(queue.popleft())
                for command in layer_commands:
                    if isinstance(command, commands.OpenConnection):
                        assert command.connection not in self.transports
                        handler = asyncio_utils.create_task(
                            self.open_connection(command),
                            name=f"server connection handler {command.connection.address}",
                            keep_ref=False,
                            client=self.client.peername,
                        )
                        self.transports[command.connection] = server.ConnectionIO(handler=handler)
                    elif isinstance(command, commands.RequestWakeup):
                        task = asyncio_utils.create_task(
                            self.wakeup(command),
                            name=f"wakeup timer ({command.delay:.1f}s)",
                            keep_ref=False,
                            client=self.client.peername,
                        )
                        assert task is not None
                        self.wakeup_timer.add(task)
                    elif (
                        isinstance(command, commands.ConnectionCommand)
                        and command.connection not in self.transports
                    ):
                        pass  # The connection has already been closed.
                    elif isinstance(command, commands.SendData):
                        connection = command.connection
                        writer = self.transports[connection].writer
                        assert writer
                        if connection.transport_protocol == "tcp":
                            chunks = pending.get(connection)
                            if chunks is None:
                                pending[connection] = [command.data]
                            else:
                                chunks.append(command.data)
                        elif not writer.is_closing():
                            writer.write(command.data)
                    elif isinstance(command, commands.CloseTcpConnection):
                        _flush(self, pending, command.connection)
                        self.close_connection(command.connection, command.half_close)
                    elif isinstance(command, commands.CloseConnection):
                        _flush(self, pending, command.connection)
                        self.close_connection(command.connection, False)
                    elif isinstance(command, commands.StartHook):
                        if _nobody_handles(self, command):  # completed here: no task, no lock round trip
                            queue.append(events.HookCompleted(command))
                            continue
                        asyncio_utils.create_task(
                            self.hook_task(command),
                            name=f"handle_hook({command.name})",
                            keep_ref=True,
                            client=self.client.peername,
                        )
                    elif isinstance(command, commands.Log):
                        self.log(command.message, command.level)
                    else:
                        raise RuntimeError(f"Unexpected command: {command}")
        except Exception:
            self.log("mitmproxy has crashed!", logging.ERROR, exc_info=True)
        finally:
            for connection in list(pending):
                _flush(self, pending, connection)


def _nobody_handles(self: Any, hook: Any) -> bool:
    """A blocking hook no addon implements (`responseheaders`, for one, on every request) for a flow
    nobody holds: its HookCompleted is what the task running it would have sent, with nothing between."""
    if not hook.blocking:
        return False
    master = getattr(self, "master", None)
    lookup = getattr(master.addons, HANDLERS_ATTR, None) if master is not None else None
    if lookup is None or lookup(hook):
        return False
    args = hook_args(hook)
    if len(args) == 1 and isinstance(args[0], flow.Flow):
        return not args[0].intercepted and not lookup(_UPDATE)
    return len(args) == 1


def _flush(self: Any, pending: dict[Any, list[bytes]], connection: Any) -> None:
    """Write a connection's pending chunks as one (mitmproxy's SendData branch, joined)."""
    chunks = pending.pop(connection, None)
    if not chunks:
        return
    io = self.transports.get(connection)
    writer = io.writer if io is not None else None
    if writer is not None and not writer.is_closing():
        writer.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))


def install_hook_cache(manager: AddonManager) -> None:
    """Dispatch each hook straight to the callables that implement it.

    mitmproxy's `trigger_event` walks every addon of the chain for every hook, with a context manager,
    a generator and a `getattr` per addon, and `handle_lifecycle` walks it a second time with an
    `update` hook after every flow hook (none of our addons implement it). With a dozen addons that walk
    was a third of the proxy's CPU. Here the (addon, method) pairs per hook name are computed once per
    chain (recomputed if addons are added or removed); semantics are mitmproxy's: chain order, sync or
    async handlers, `AddonHalt` stops the hook, `OptionsError` propagates, other errors are logged
    as "Addon error" and the next handler runs; the `update` hook still reaches an addon that has one.
    """
    cache: dict[str, list[Callable[..., Any]]] = {}
    chain_size = [-1]

    def handlers_of(event: hooks.Hook) -> list[Callable[..., Any]]:
        name = event.name
        if len(manager.chain) != chain_size[0]:
            cache.clear()
            chain_size[0] = len(manager.chain)
        handlers = cache.get(name)
        if handlers is None:
            handlers = [func for addon in manager.chain for _, func in manager._iter_hooks(addon, event)]
            cache[name] = handlers
        return handlers

    async def trigger_event(event: hooks.Hook) -> None:
        handlers = handlers_of(event)
        if not handlers:
            return
        args = hook_args(event)
        for func in handlers:
            try:
                result = func(*args)
                if result is not None and inspect.isawaitable(result):
                    await result
            except exceptions.AddonHalt:
                return
            except exceptions.OptionsError:
                raise
            except Exception as exc:
                mitm_log.error(f"Addon error: {exc}", exc_info=True)

    async def handle_lifecycle(event: hooks.Hook) -> None:
        await trigger_event(event)
        message = hook_args(event)[0]
        if isinstance(message, flow.Flow) and handlers_of(_UPDATE):  # none of ours: not built per flow hook
            await trigger_event(hooks.UpdateHook([message]))

    setattr(manager, HANDLERS_ATTR, handlers_of)  # for _server_event: hooks nobody implements
    # Replacing methods on the instance is the point here; mypy forbids it by default.
    manager.trigger_event = trigger_event  # type: ignore[method-assign]
    manager.handle_lifecycle = handle_lifecycle  # type: ignore[method-assign]
