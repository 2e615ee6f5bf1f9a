"""The simulated WAN link (cluster/wan.py): bytes arrive whole and in order, each direction at least the
configured one-way delay late, end of stream included; a target that refuses is counted, not fatal."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from cluster.wan import DelayRelay


async def echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_round_trip_takes_at_least_both_delays_and_keeps_every_byte_in_order() -> None:
    server, port = await echo_server()
    async with server, DelayRelay("127.0.0.1", port, delay=0.05) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        payload = os.urandom(300_000)  # several chunks each way
        started = time.monotonic()
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        echoed = await asyncio.wait_for(reader.read(), 10.0)  # until the delayed end of stream
        took = time.monotonic() - started
        writer.close()
        assert echoed == payload
        # A lower bound: the relay's whole purpose is to add the delay (a slow machine only adds more).
        assert took >= 0.1
        assert relay.stats.bytes_up == relay.stats.bytes_down == len(payload)
        assert relay.stats.connections == 1


async def test_requests_on_one_connection_each_pay_the_delay() -> None:
    server, port = await echo_server()
    async with server, DelayRelay("127.0.0.1", port, delay=0.02) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        for n in range(5):
            started = time.monotonic()
            writer.write(f"ping {n}\n".encode())
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 5.0)
            assert line == f"ping {n}\n".encode()
            assert time.monotonic() - started >= 0.04
        writer.close()


async def test_a_refusing_target_closes_the_client_and_is_counted() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens there now
    async with DelayRelay("127.0.0.1", port, delay=0.01) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()
        assert relay.stats.refused == 1


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        DelayRelay("127.0.0.1", 1, delay=-0.1)
