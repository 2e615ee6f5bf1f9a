"""A simulated wide-area link: a TCP relay that delays each direction by a fixed one-way latency.

This machine's kernel has no netem, so tests and demos of regions (issue 16) put one of these between a
client in one "region" and a server in another: every chunk read on one side is written to the other side
`delay` seconds later, in order, in both directions, and an end of stream (EOF) takes the same time to
arrive. Bandwidth and loss are not simulated. A real deployment has real regions and needs none of this.

Written by hand: no package in the registries relays TCP with a delay; the relay is asyncio streams and a
queue per direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

log = logging.getLogger("strictq.wan")
CHUNK = 64 * 1024


@dataclass
class RelayStats:
    connections: int = 0
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0  # server -> client
    refused: int = 0  # connections the target did not accept


@dataclass
class DelayRelay:
    """Listens on `host:port` (0: a free port) and relays each connection to `target_host:target_port`,
    each direction `delay` seconds late."""

    target_host: str
    target_port: int
    delay: float
    host: str = "127.0.0.1"
    port: int = 0
    stats: RelayStats = field(default_factory=RelayStats)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.delay < 0:
            raise ValueError("a one-way delay cannot be negative")

    async def start(self) -> int:
        """Start listening; the port it listens on."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def __aenter__(self) -> DelayRelay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self.stats.refused += 1
            client_writer.close()
            return
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(client_reader, server_writer, up=True))
                group.create_task(self._pump(server_reader, client_writer, up=False))
        except* (ConnectionError, OSError) as errors:
            log.debug("relay connection ended: %s", errors.exceptions[0])
        finally:
            for writer in (client_writer, server_writer):
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
        """Read as it comes; write each chunk `delay` after it was read (a queue keeps the order, and a
        reader never waits for the delayed writes)."""
        loop = asyncio.get_running_loop()
        pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await pending.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not chunk:  # end of stream, as late as the data before it
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
                if up:
                    self.stats.bytes_up += len(chunk)
                else:
                    self.stats.bytes_down += len(chunk)

        delivering = asyncio.create_task(deliver())
        try:
            while True:
                chunk = await reader.read(CHUNK)
                pending.put_nowait((loop.time() + self.delay, chunk))
                if not chunk:
                    break
            await delivering
        finally:
            if not delivering.done():
                delivering.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await delivering
