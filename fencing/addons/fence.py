"""Fence addon: cut a fenced worker off from the backends, or answer it from recordings.

The core decides fences (the control stream is the only source; see `Control`). For a fenced worker:
- `block`: every call, tagged or not, gets 403 `block` from the proxy. No upstream connection is ever
  opened for it: the connection strategy is lazy (a CONNECT tunnel dials nothing by itself) and
  upstream certificates are not sniffed (the interception certificate comes from the SNI alone), so
  the answer is given before anything would dial out. This addon enforces both options at start-up.
- `mimic`: the call is answered from the wire log's recorded responses (`fencing.mimic`), with
  `ctx.action = "mimic"` and `ctx.replayed_from` = the record id; nothing matching: 503 `unmatched`.

While the control stream is down the last known fences stay in force (the lease guard answers tagged
calls 503 `unsynced` meanwhile); a snapshot on reconnection replaces them.

A CONNECT tunnel of a fenced worker that carries neither TLS nor HTTP (mitmproxy would relay it raw,
dialling the backend) is closed instead (`next_layer`).

When a worker is fenced (either mode) its open upstream connections, in-flight streams and idle
keep-alive ones alike, are closed at once: from that moment nothing it sent earlier keeps flowing.
mitmproxy 12 cannot kill a flow in transit (`Flow.kill` only acts at the next hook), so this closes the
server connections through the connection handlers of the `proxyserver` addon (pinned 12.2.3 API).

Options: `strictq_mimic_wirelog` (directory of recordings; empty: the capture addon's
`strictq_wirelog`, the proxy's own wire log), `strictq_mimic_refresh` (seconds: a miss re-reads new
segments at most this often), `strictq_mimic_max_records`, `strictq_mimic_max_bytes` (index bounds).

Replay mode (`strictq_replay`, set by `strictq proxy --replay-from DIR`, used by `strictq replay`):
every authenticated worker is treated as mimic-fenced, so every call is answered from the recordings
in `strictq_mimic_wirelog` and none is ever forwarded (raw tunnels are closed for everyone). Matching
follows `fencing.replay.matching` (per message and ordinal first, then by identity), with the masks of
`strictq_replay_mask` (a JSON/TOML file, `fencing.replay.masking`) applied to both sides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mitmproxy import connection, ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import TCPLayer, UDPLayer

from fencing.context import PROXY_ACTION_HEADER, CallContext, context_of, refuse
from fencing.control_client import ControlState, FenceInfo
from fencing.mimic import Cursors, RecordingIndex, scan

if TYPE_CHECKING:
    from fencing.replay.masking import Masker
    from fencing.replay.matching import ReplayIndex

logger = logging.getLogger(__name__)

WIRELOG_OPTION = "strictq_wirelog"  # the capture addon's: read when strictq_mimic_wirelog is empty
REQUIRED_OPTIONS = {"connection_strategy": "lazy", "upstream_cert": False}


class Fence:
    """Answers calls of fenced workers itself (block: 403, mimic: recorded responses)."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
        self.cursors = Cursors()
        self.index: RecordingIndex | ReplayIndex | None = None
        self.replay = False  # every worker's calls are answered from the recordings (replay mode)
        self._masker: Masker | None = None
        self._loading: asyncio.Task[None] | None = None
        self._directory: Path | None = None
        self._refresh = 2.0
        self._max_records = 200_000
        self._max_bytes = 256 * 1024 * 1024
        self._master: Any = None
        self._enforced = False  # set once running() has put the required options in place
        # Which client connections (mitmproxy client ids) carry which worker's calls.
        self._worker_of_client: dict[str, str] = {}
        self._clients_of_worker: dict[str, set[str]] = {}
        self.closed_connections = 0
        self.blocked = 0
        self.mimicked = 0
        self.unmatched = 0
        state.add_listener(self._on_fence_change)

    # -- options ------------------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        self._master = loader.master
        add = loader.add_option
        add("strictq_mimic_wirelog", str, "", "Wire-log directory to mimic from; empty: strictq_wirelog.")
        add("strictq_mimic_refresh", float, 2.0, "Seconds between re-reads of the wire log on a miss.")
        add("strictq_mimic_max_records", int, 200_000, "Recordings kept in memory for mimicry.")
        add("strictq_mimic_max_bytes", int, 256 * 1024 * 1024, "Bytes of recordings kept in memory.")
        add("strictq_replay", bool, False, "Replay mode: answer every worker's calls from the recordings.")
        add("strictq_replay_mask", str, "", "Replay mode: mask config (JSON/TOML) for matching.")

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if updated & {"strictq_mimic_wirelog", WIRELOG_OPTION}:
            self._directory = self._wirelog_directory()
            self.index = None  # reloaded lazily from the new place
        if "strictq_mimic_refresh" in updated:
            if opts.strictq_mimic_refresh < 0:
                raise exceptions.OptionsError("strictq_mimic_refresh must be >= 0")
            self._refresh = opts.strictq_mimic_refresh
        if updated & {"strictq_replay", "strictq_replay_mask"}:
            self._configure_replay(opts.strictq_replay, opts.strictq_replay_mask)
        if updated & {"strictq_mimic_max_records", "strictq_mimic_max_bytes"}:
            records, size = opts.strictq_mimic_max_records, opts.strictq_mimic_max_bytes
            if records < 1 or size < 1:
                raise exceptions.OptionsError("strictq_mimic_max_records and _max_bytes must be positive")
            self._max_records, self._max_bytes = records, size
            self.index = None
        if self._enforced and not updated.isdisjoint(REQUIRED_OPTIONS) and self._wrong_options():
            raise exceptions.OptionsError(
                "the fence needs connection_strategy=lazy and upstream_cert=false "
                "(a blocked worker must never make the proxy dial its backend)"
            )

    def _configure_replay(self, replay: bool, mask: str) -> None:
        self._masker = None
        if replay and mask:
            from fencing.replay.masking import MaskConfig, Masker, MaskError

            try:
                self._masker = Masker(MaskConfig.load(Path(mask)))
            except MaskError as exc:
                raise exceptions.OptionsError(f"strictq_replay_mask: {exc}") from exc
        self.replay = replay
        self.index = None  # reloaded (as a replay index or not) on the next call

    def _fence_of(self, worker: str) -> FenceInfo | None:
        """The worker's fence; in replay mode every worker without one is mimicked."""
        fence = self.state.fences.get(worker)
        if fence is None and self.replay:
            return FenceInfo(worker=worker, mode="mimic", reason="replay", since=0.0, expires=None)
        return fence

    @staticmethod
    def _wrong_options() -> dict[str, object]:
        opts = ctx.options
        return {k: v for k, v in REQUIRED_OPTIONS.items() if k in opts and getattr(opts, k) != v}

    def running(self) -> None:
        """Enforce the options that keep a blocked worker from ever causing an upstream dial."""
        wrong = self._wrong_options()
        if wrong:
            logger.info("fence: setting %s", ", ".join(f"{k}={v}" for k, v in wrong.items()))
            ctx.options.update(**wrong)
        self._enforced = True
        if self.replay or any(f.mode == "mimic" for f in self.state.fences.values()):
            self._start_loading()

    def _wirelog_directory(self) -> Path | None:
        opts = ctx.options
        for name in ("strictq_mimic_wirelog", WIRELOG_OPTION):
            value = getattr(opts, name, None) if name in opts else None
            if isinstance(value, str) and value:
                return Path(value)
        return None

    # -- hooks --------------------------------------------------------------------------------------------
    def http_connect(self, flow: http.HTTPFlow) -> None:
        ctx_ = context_of(flow)
        if ctx_ is not None and ctx_.worker is not None:
            self._track(flow, ctx_.worker)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        call = context_of(flow)
        if call is None or call.worker is None:
            return
        self._track(flow, call.worker)
        fence = self._fence_of(call.worker)
        if fence is None:
            return
        fence = self._probe_view(fence, call)
        if fence is None:
            return
        # Neither mode may stream the request upstream before `request`: buffer the body.
        flow.request.stream = False
        if fence.mode == "block":
            self._block(flow, call, fence)

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response is not None:
            return None
        call = context_of(flow)
        if call is None or call.worker is None:
            return None
        fence = self._fence_of(call.worker)  # again: it may have come while the body arrived
        if fence is None:
            return None
        fence = self._probe_view(fence, call)
        if fence is None:
            return None
        if fence.mode == "block":
            self._block(flow, call, fence)
            return None
        return self._mimic(flow, call)

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        """A CONNECT tunnel whose bytes are neither TLS nor HTTP becomes a raw relay (`rawtcp`), which
        would dial the backend with no request for the guards to answer: a fenced worker gets none."""
        chosen = nextlayer.layer
        if isinstance(chosen, TCPLayer | UDPLayer):
            worker = self._worker_of_client.get(nextlayer.context.client.id)
            if self.replay or (worker is not None and worker in self.state.fences):
                self.blocked += 1
                logger.info("fence: refused a raw tunnel of fenced worker %s", worker)
                nextlayer.layer = _ClosedTunnel(nextlayer.context)

    def client_disconnected(self, client: connection.Client) -> None:
        worker = self._worker_of_client.pop(client.id, None)
        if worker is not None:
            clients = self._clients_of_worker.get(worker)
            if clients is not None:
                clients.discard(client.id)
                if not clients:
                    del self._clients_of_worker[worker]

    def _track(self, flow: http.HTTPFlow, worker: str) -> None:
        client_id = flow.client_conn.id
        if self._worker_of_client.get(client_id) != worker:
            self._worker_of_client[client_id] = worker
            self._clients_of_worker.setdefault(worker, set()).add(client_id)

    def _probe_view(self, fence: FenceInfo, call: CallContext) -> FenceInfo | None:
        """A fenced worker's call for its active probe (failure management's dummy message, announced on
        the control stream) is passed (the queue's `probe_safe`) or mimicked, never blocked: so a
        block-fenced worker can still pass a probe."""
        mode = self.state.probe_mode(fence.worker, call.message_id)
        if mode is None:
            return fence
        if mode == "pass":
            return None
        return fence if fence.mode == "mimic" else dataclasses.replace(fence, mode="mimic")

    # -- block --------------------------------------------------------------------------------------------
    def _block(self, flow: http.HTTPFlow, call: CallContext, fence: FenceInfo) -> None:
        self.blocked += 1
        refuse(
            flow,
            call,
            status=403,
            action="block",
            code="fenced",
            message=f"worker {fence.worker} is fenced (block): {fence.reason}",
        )
        flow.request.stream = False

    # -- mimic --------------------------------------------------------------------------------------------
    def _mimic(self, flow: http.HTTPFlow, call: CallContext) -> Awaitable[None] | None:
        index = self.index
        if index is None:
            return self._mimic_after_load(flow, call)
        if self._answer(flow, call, index):
            return None
        if not self.replay and time.monotonic() - index.loaded_at >= self._refresh:
            return self._mimic_after_load(flow, call)  # maybe it was recorded since the last read
        self._unmatched(flow, call)
        return None

    async def _mimic_after_load(self, flow: http.HTTPFlow, call: CallContext) -> None:
        await self._start_loading()
        index = self.index
        if index is None or not self._answer(flow, call, index):
            self._unmatched(flow, call)

    def _answer(self, flow: http.HTTPFlow, call: CallContext, index: RecordingIndex | ReplayIndex) -> bool:
        identity = call.request_identity
        if identity is None:
            return False
        if self._masker is not None:
            from fencing.replay.matching import masked_identity

            identity = masked_identity(identity, call.request_view, self._masker)
        found = index.candidates(identity, call.message_id, call.call)
        if found is None:
            return False
        key, sequence = found
        assert call.worker is not None
        recording = self.cursors.next(call.worker, key, sequence)
        call.action = "mimic"
        call.code = None
        call.replayed_from = recording.record_id
        headers = http.Headers([(k.encode(), v.encode()) for k, v in recording.headers])
        headers[PROXY_ACTION_HEADER] = "mimic"
        flow.response = http.Response.make(recording.status, recording.body, headers)
        self.mimicked += 1
        return True

    def _unmatched(self, flow: http.HTTPFlow, call: CallContext) -> None:
        self.unmatched += 1
        method, host, path = flow.request.method, flow.request.pretty_host, flow.request.path
        why = "replay mode" if self.replay else "fenced (mimic)"
        refuse(
            flow,
            call,
            status=503,
            action="unmatched",
            code="unmatched",
            message=f"worker {call.worker} is {why} and no recording matched {method} {host}{path}",
        )

    def _start_loading(self) -> asyncio.Task[None]:
        """One (re)load at a time: readers of the same miss share it."""
        if self._loading is None or self._loading.done():
            self._loading = asyncio.get_running_loop().create_task(self._load(), name="mimic: load wire log")
        return self._loading

    async def _load(self) -> None:
        if self.replay:
            await self._load_replay()
            return
        directory = self._directory
        if directory is None:
            logger.warning("mimic: no wire-log directory configured; every mimicked call is unmatched")
            if self.index is None:
                self.index = RecordingIndex(self._max_records, self._max_bytes)
            self.index.loaded_at = time.monotonic()
            return
        current = self.index  # None or (the mode having been reset to None on a switch) a RecordingIndex
        if isinstance(current, RecordingIndex) and current:
            index = current
        else:
            index = RecordingIndex(self._max_records, self._max_bytes)
        try:
            result = await asyncio.to_thread(scan, directory, dict(index.files), set(index.ids))
        except Exception:
            logger.exception("mimic: cannot read the wire log in %s", directory)
            index.loaded_at = time.monotonic()
            self.index = index
            return
        added = index.merge(result)
        self.index = index
        logger.info("mimic: %d new recordings from %s (%d in memory)", added, directory, len(index))

    async def _load_replay(self) -> None:
        """The whole recording, once (it does not change while a replay runs)."""
        from fencing.replay.matching import ReplayIndex, load_index

        if isinstance(self.index, ReplayIndex):
            return
        directory = self._directory
        if directory is None:
            logger.warning("replay: no recording directory configured; every call is unmatched")
            self.index = ReplayIndex(masker=self._masker)
            return
        try:
            index = await asyncio.to_thread(load_index, directory, self._masker)
        except Exception:
            logger.exception("replay: cannot read the recording in %s", directory)
            index = ReplayIndex(masker=self._masker)
        self.index = index
        logger.info(
            "replay: %d recordings from %s (%d unreadable segments)", len(index), directory, index.errors
        )

    # -- fence changes ------------------------------------------------------------------------------------
    def _on_fence_change(self, kind: str, worker: str, fence: FenceInfo | None) -> None:
        self.cursors.reset(worker)  # a new fence (or none) starts the worker's sequences over
        if kind != "fence" or fence is None:
            if (
                self.index is not None
                and not self.replay
                and not any(f.mode == "mimic" for f in self.state.fences.values())
            ):
                self.index = None  # nobody to mimic for: free the memory, reload when needed
            return
        self.close_upstream(worker)
        if fence.mode == "mimic":
            try:
                self._start_loading()
            except RuntimeError:  # no running loop (state applied outside the proxy): load lazily
                pass

    def close_upstream(self, worker: str) -> int:
        """Close every server connection opened for this worker's client connections."""
        master = self._master
        proxyserver = master.addons.get("proxyserver") if master is not None else None
        if proxyserver is None:
            return 0
        closed = 0
        for client_id in list(self._clients_of_worker.get(worker, ())):
            handler = proxyserver.connections.get(client_id)
            if handler is None:
                continue
            for conn in list(handler.transports):
                if (
                    isinstance(conn, connection.Server)
                    and conn.state is not connection.ConnectionState.CLOSED
                ):
                    try:
                        handler.close_connection(conn)
                    except (KeyError, AssertionError):  # already going away
                        continue
                    closed += 1
        if closed:
            logger.info("fence: closed %d upstream connection(s) of worker %s", closed, worker)
        self.closed_connections += closed
        return closed


class _ClosedTunnel(layer.Layer):
    """In place of a raw relay for a fenced worker: closes the client side, never opens the server's."""

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            yield commands.CloseConnection(self.context.client)
