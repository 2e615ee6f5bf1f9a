"""Fence addon: decide whether a worker's call is fenced; block it, or hand it to the mimic addon.

The core decides fences (the control stream is the only source; see `Control`). For a fenced worker:
- `block`: every call, tagged or not, gets 403 `block` from the proxy. No upstream connection is ever
  opened for it: the connection strategy is lazy (a CONNECT tunnel dials nothing by itself) and
  upstream certificates are not sniffed (the interception certificate comes from the SNI alone), so
  the answer is given before anything would dial out. This addon enforces both options at start-up.
- `mimic`: the call is marked on the flow for the mimic addon (`fencing.answering.mark_mimic`), which
  comes next in the chain and answers it from recorded responses (`fencing.addons.mimic`).
Either way the request body is buffered (never streamed upstream before `request`).

While the control stream is down the last known fences stay in force (the lease guard answers tagged
calls 503 `unsynced` meanwhile); a snapshot on reconnection replaces them.

A CONNECT tunnel of a fenced worker that carries neither TLS nor HTTP (mitmproxy would relay it raw,
dialling the backend) is closed instead (`next_layer`).

When a worker is fenced (either mode) its open upstream connections, in-flight streams and idle
keep-alive ones alike, are closed at once: from that moment nothing it sent earlier keeps flowing.
mitmproxy 12 cannot kill a flow in transit (`Flow.kill` only acts at the next hook), so this closes the
server connections through the connection handlers of the `proxyserver` addon (pinned 12.2.3 API).

Replay mode (the mimic addon's option `strictq_replay`, set by `strictq proxy --replay-from DIR`,
used by `strictq replay`; read here when declared): every authenticated worker is treated as
mimic-fenced, so every call is answered from the recording and none is ever forwarded (raw tunnels are
closed for everyone).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from mitmproxy import connection, ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import TCPLayer, UDPLayer

from fencing.answering import mark_mimic
from fencing.context import CallContext, context_of, refuse
from fencing.control_client import ControlState, FenceInfo
from protocol import errors
from wirelog.record import ACTION_BLOCK

logger = logging.getLogger(__name__)

REPLAY_OPTION = "strictq_replay"  # the mimic addon's: in replay mode every worker is mimic-fenced
REQUIRED_OPTIONS = {"connection_strategy": "lazy", "upstream_cert": False}


class Fence:
    """Decides per call whether its worker is fenced: block answers 403 here, mimic marks the flow."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
        self.replay = False  # every worker counts as mimic-fenced (replay mode)
        self._master: Any = None
        self._enforced = False  # set once running() has put the required options in place
        # Which client connections (mitmproxy client ids) carry which worker's calls.
        self._worker_of_client: dict[str, str] = {}
        self._clients_of_worker: dict[str, set[str]] = {}
        self.closed_connections = 0
        self.blocked = 0
        state.add_listener(self._on_fence_change)

    # -- options ------------------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        self._master = loader.master

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if REPLAY_OPTION in updated and REPLAY_OPTION in opts:
            self.replay = bool(getattr(opts, REPLAY_OPTION))
        if self._enforced and not updated.isdisjoint(REQUIRED_OPTIONS) and self._wrong_options():
            raise exceptions.OptionsError(
                "the fence needs connection_strategy=lazy and upstream_cert=false "
                "(a blocked worker must never make the proxy dial its backend)"
            )

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

    def request(self, flow: http.HTTPFlow) -> None:
        """Decide again (a fence may have come, or gone, while the body arrived): block answers here, a
        mimic verdict is left on the flow for the mimic addon, next in the chain."""
        if flow.response is not None:
            return
        call = context_of(flow)
        if call is None or call.worker is None:
            return
        fence = self._fence_of(call.worker)
        if fence is not None:
            fence = self._probe_view(fence, call)
        if fence is not None and fence.mode == "block":
            self._block(flow, call, fence)
            return
        mark_mimic(flow, fence)

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
            action=ACTION_BLOCK,
            code=errors.FENCED,
            message=f"worker {fence.worker} is fenced (block): {fence.reason}",
        )
        flow.request.stream = False

    # -- fence changes ------------------------------------------------------------------------------------
    def _on_fence_change(self, kind: str, worker: str, fence: FenceInfo | None) -> None:
        if kind == "fence" and fence is not None:
            self.close_upstream(worker)

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
