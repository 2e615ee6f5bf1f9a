"""Connections that cannot pin the server: a request-head timeout, and memory that returns after slow readers.

aiohttp already bounds one connection's buffers: it parses at most 32 pipelined requests ahead and then
pauses reading, and each response awaits the transport's drain (the write buffer's high-water mark) before
the next pipelined request is handled. What it lacks (issue 11, item 8):

- a header timeout: its only clock is the keep-alive timeout (default 3630 s), so a plain or TLS connection
  that dribbles an incomplete request head is held for an hour. `GuardedHandler` closes a connection whose
  request head is not complete `header_timeout` seconds after the connection opened or after the head's
  first byte arrived; `GuardedSite` also bounds the TLS handshake by the same limit.
- memory that returns: a slow reader's response bodies end up in reference cycles (the connection-reset
  exception's traceback holds the handler's frames) which the raised collector thresholds of the servers
  (see `gc.set_threshold` in strictq.queue_server) leave uncollected on an idle server, and glibc keeps freed
  large blocks in its heaps. `MemoryRelief` collects once after slow readers leave and hands free pages
  back to the kernel (`malloc_trim`); `tune_malloc` keeps large buffers in their own mappings, which are
  returned as soon as they are freed.

No maintained library adds a head timeout to aiohttp's server (nor is there an option for it), so this is a
small subclass of its `RequestHandler`; it reads a few of its private fields (pinned aiohttp 3.14.5), and
tests/test_security_memory.py fails if an upgrade changes them.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from protocol.errors import HTTP_ERROR, HTTP_ERROR_CODES, INTERNAL, error_body

from .http_errors import client_gone

log = logging.getLogger("strictq.connections")

DEFAULT_HEADER_TIMEOUT = 20.0  # seconds for a complete request head (nginx: 60 s; slowloris wants minutes)
DEFAULT_KEEPALIVE_TIMEOUT = 75.0  # idle keep-alive connections (aiohttp's default is 3630 s)
# Bytes that readers who stopped reading may keep in our write buffers, all connections together; past it
# the longest-stalled connections are closed. A stalled response also holds its body, so the memory bound
# is about twice this.
DEFAULT_STALLED_BYTES = 32 * 1024 * 1024
RELIEF_DELAY = 1.0  # after slow readers leave: collect and trim at most once a second
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD = 256 * 1024  # allocations above this get their own mapping, unmapped when freed
MAX_ERROR_MESSAGE = 300  # characters of aiohttp's own error text in a JSON answer
_STATUSES = frozenset(int(s) for s in HTTPStatus)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The per-connection limits of a server's listener."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    stalled_bytes: int = DEFAULT_STALLED_BYTES

    def __post_init__(self) -> None:
        if not self.header_timeout > 0:
            raise ValueError("header_timeout must be > 0 seconds")
        if not self.keepalive_timeout > 0:
            raise ValueError("keepalive_timeout must be > 0 seconds")
        if self.stalled_bytes < 0:
            raise ValueError("stalled_bytes must be >= 0")

    def handler_args(self) -> dict[str, Any]:
        """For `web.AppRunner(..., **limits.handler_args())`."""
        return {"keepalive_timeout": self.keepalive_timeout}


DEFAULT_LIMITS = ConnectionLimits()


class _Libc:
    """glibc's malloc tuning, or nothing where it is not glibc (musl, macOS)."""

    def __init__(self) -> None:
        self.trim: Any = None
        self.mallopt: Any = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
            self.trim = libc.malloc_trim
            self.mallopt = libc.mallopt
        except (OSError, AttributeError):
            pass


_LIBC = _Libc()


def tune_malloc() -> bool:
    """Give large blocks (response bodies) their own mappings, so freeing one returns it to the kernel.

    glibc raises its mmap threshold each time such a block is freed, after which large bodies live in the
    heap and stay in the process's RSS. Fixing the threshold (which also fixes the trim threshold at its
    default) stops that. Returns whether it applied (glibc only)."""
    if _LIBC.mallopt is None:
        return False
    return bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class SlowReaders:
    """Connections whose client stopped reading (the transport paused our writes), for one listener.

    Bounds the bytes they keep in write buffers (`limit`, all of them together: past it the longest-stalled
    connections are closed), and collects and trims the heap once, shortly after slow readers have left."""

    def __init__(self, limit: int, delay: float = RELIEF_DELAY) -> None:
        self.limit = limit
        self.delay = delay
        self.reliefs = 0  # collections run (for tests and metrics)
        self.closed = 0  # connections closed over the limit
        self._stalled: dict[GuardedHandler, int] = {}  # insertion order: longest stalled first
        self._pending: asyncio.TimerHandle | None = None

    @property
    def stalled_bytes(self) -> int:
        return sum(self._stalled.values())

    def paused(self, handler: GuardedHandler, buffered: int) -> None:
        self._stalled.pop(handler, None)
        self._stalled[handler] = buffered
        total = self.stalled_bytes
        for victim in list(self._stalled):
            if total <= self.limit or victim is handler:
                break
            unsent = self._stalled.pop(victim)
            total -= unsent
            self.closed += 1
            log.warning("closed a connection from %s: not reading (%d bytes unsent)", victim.peer(), unsent)
            victim.abort()

    def resumed(self, handler: GuardedHandler) -> None:
        self._stalled.pop(handler, None)

    def left(self, handler: GuardedHandler, stalled: bool) -> None:
        self._stalled.pop(handler, None)
        if stalled and self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self.delay, self._relieve)

    def _relieve(self) -> None:
        self._pending = None
        self.reliefs += 1
        gc.collect()  # their bodies sit in cycles; the frozen backlog (gc.freeze) is not traversed
        if _LIBC.trim is not None:
            _LIBC.trim(0)  # free pages back to the kernel

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


class GuardedHandler(RequestHandler):
    """aiohttp's request handler with a request-head timeout and a budget for slow readers."""

    __slots__ = ("_head_timeout", "_head_timer", "_heads_at_arm", "_slow")

    def __init__(self, manager: web.Server, *, head_timeout: float, slow: SlowReaders, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._heads_at_arm = 0
        self._slow = slow

    def __hash__(self) -> int:
        return id(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()  # a connection that never sends a complete head is closed too

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._disarm()  # a head is complete (or answered 400)
        elif data and self._head_timer is None and self._idle():
            self._arm()  # the first bytes of the next request: its head has the same limit

    def pause_writing(self) -> None:
        super().pause_writing()
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        self._slow.paused(self, buffered)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._slow.resumed(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        stalled = self.writing_paused  # it left with our response unread
        super().connection_lost(exc)
        self._slow.left(self, stalled)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """What aiohttp answers itself (its parser's 400s: a header over 8190 bytes, a bad character, a
        bad chunk; a handler's uncaught error) as JSON like every other error of these servers, and a client
        that dropped its connection mid-request as one WARNING line (no traceback, nothing to answer)."""
        if client_gone(request, exc):
            log.warning(
                "client %s went away during %s %s: %s", self.peer(), request.method, request.path, exc
            )
            gone = web.Response(status=400)
            gone.force_close()
            return gone
        super().handle_error(request, status, exc, message)  # logs (one line for a malformed request)
        if status == 500:
            body = error_body(INTERNAL, "internal error; see the server log")
        else:
            code = HTTP_ERROR_CODES.get(status, HTTP_ERROR)
            text = message or (HTTPStatus(status).phrase if status in _STATUSES else "error")
            body = error_body(code, str(text)[:MAX_ERROR_MESSAGE])
        response = web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
        response.force_close()
        return response

    def abort(self) -> None:
        """Close now, dropping what is buffered (a plain close would wait for the reader to take it)."""
        if self.transport is not None:
            self.transport.abort()
        self.force_close()

    def peer(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport is not None else None

    def _idle(self) -> bool:
        """No request being handled or waiting: further bytes start a new request head."""
        return not self._request_in_progress and not self._messages

    def _arm(self) -> None:
        self._heads_at_arm = self._request_count
        self._head_timer = self._loop.call_later(self._head_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._request_count == self._heads_at_arm and self.transport is not None:
            log.info("closed a connection from %s: no request head in %gs", self.peer(), self._head_timeout)
            self.force_close()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections are `GuardedHandler`s, with the TLS handshake bounded too."""

    __slots__ = ("_limits", "slow_readers")

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        limits: ConnectionLimits,
        ssl_context: ssl.SSLContext | None = None,
        reuse_address: bool | None = None,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, reuse_address=reuse_address)
        self._limits = limits
        self.slow_readers = SlowReaders(limits.stalled_bytes)

    async def start(self) -> None:
        # TCPSite.start, with our protocol factory and the handshake timeout (it passes neither).
        await web.BaseSite.start(self)
        tune_malloc()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # The Server's own factory is `RequestHandler(server, loop=..., **handler kwargs)`; the same here.
        kwargs: dict[str, Any] = dict(getattr(server, "_kwargs", {}))
        head_timeout, slow = self._limits.header_timeout, self.slow_readers

        def factory() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, head_timeout=head_timeout, slow=slow, **kwargs)

        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=head_timeout if self._ssl_context is not None else None,
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.slow_readers.cancel()
        await super().stop()
