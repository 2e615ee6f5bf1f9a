"""The proxy's fast path through mitmproxy (`fencing.mitm_fastpath`): the same behaviour, less CPU.

Through a real in-process mitmproxy `Master` (its proxy-server addons, our hook dispatch, the patches)
and a raw asyncio backend whose answers are byte-exact: bodies arrive whole whatever their framing
(length, chunked, close-delimited) with the writes joined per event; hooks an addon implements still
run, in chain order, including `responseheaders` and `update`, which the fast path skips only when
nobody implements them; option reads still hand out copies of mutable values.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mitmproxy import exceptions, http, optmanager
from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.tlsconfig import TlsConfig
from mitmproxy.master import Master
from mitmproxy.options import Options

from fencing import mitm_fastpath
from fencing.ca import confdir

BIG = bytes(range(256)) * 4096  # 1 MiB, every byte value
CHUNKS = [b"first chunk ", b"x" * 70_000, b" last"]


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A backend speaking HTTP/1.1 by hand, so each framing is exactly what the test says."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            if path.endswith("/length"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG)
            elif path.endswith("/chunked"):
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for chunk in CHUNKS:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:  # close-delimited: no length, the body ends when the connection does
                writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end" + BIG)
                await writer.drain()
                writer.close()
                return
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


class Recorder:
    """Records the hooks it implements, in order, per request path."""

    def __init__(self, name: str, seen: list[str], extra: bool) -> None:
        self.name, self.seen = name, seen
        if extra:  # only this instance implements them: the fast path must then still call them
            self.responseheaders = self._responseheaders
            self.update = self._update

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self.seen.append(f"{self.name}.requestheaders")

    def response(self, flow: http.HTTPFlow) -> None:
        self.seen.append(f"{self.name}.response")

    def _responseheaders(self, flow: http.HTTPFlow) -> None:
        self.seen.append(f"{self.name}.responseheaders")

    def _update(self, flows: list[Any]) -> None:
        self.seen.append(f"{self.name}.update")


class Slow:
    """An async `request` handler (as the mimic addon's while it loads recordings): the handlers after it
    wait for it, and the request goes upstream only once the hook is complete."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def request(self, flow: http.HTTPFlow) -> Any:
        async def later() -> None:
            await asyncio.sleep(0.05)
            flow.request.headers["X-Slow"] = "done"
            self.seen.append("slow.request")

        return later()


class After:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def request(self, flow: http.HTTPFlow) -> None:
        self.seen.append(f"after.request {flow.request.headers.get('X-Slow')}")


class Halting:
    """Stops the `response` hook: the addons after it must not see it (mitmproxy's AddonHalt)."""

    def response(self, flow: http.HTTPFlow) -> None:
        raise exceptions.AddonHalt()


class Proxy:
    """A mitmproxy `Master` with the fast path, on a thread and loop of its own (as in the proxy)."""

    def __init__(self, data_dir: Path, addons: list[Any]) -> None:
        self.data_dir, self.addons = data_dir, addons
        self.url = ""
        self.master: Master | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Proxy:
        self._thread.start()
        assert self._ready.wait(30), "mitmproxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.master is not None
        self.master.shutdown()
        self._thread.join(15)

    async def _main(self) -> None:
        assert mitm_fastpath.install()
        self.master = master = Master(Options(confdir=str(confdir(self.data_dir))), with_termlog=False)
        master.addons.add(Proxyserver(), NextLayer(), TlsConfig(), *self.addons)
        mitm_fastpath.install_hook_cache(master.addons)
        master.options.update(mode=["regular"], listen_host="127.0.0.1", listen_port=0)
        task = asyncio.create_task(master.run())
        proxyserver = master.addons.get("proxyserver")
        while not proxyserver.listen_addrs() and not task.done():  # noqa: ASYNC110 - mitmproxy has no event for it
            await asyncio.sleep(0.02)
        self.url = f"http://127.0.0.1:{proxyserver.listen_addrs()[0][1]}"
        self._ready.set()
        await task


@pytest.fixture
async def backend() -> Any:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest.fixture
def seen() -> Iterator[list[str]]:
    yield []


async def test_bodies_arrive_whole_in_every_framing_over_one_kept_alive_connection(
    tmp_path: Path, backend: str, seen: list[str]
) -> None:
    with Proxy(tmp_path, [Recorder("a", seen, extra=False)]) as proxy:
        connector = aiohttp.TCPConnector(limit=1)  # one client connection: requests follow each other on it
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(3):
                async with session.get(f"{backend}/length", proxy=proxy.url) as response:
                    assert response.status == 200
                    assert await response.read() == BIG
                async with session.get(f"{backend}/chunked", proxy=proxy.url) as response:
                    assert await response.read() == b"".join(CHUNKS)
            async with session.get(f"{backend}/close", proxy=proxy.url) as response:
                assert await response.read() == b"until the end" + BIG
    # 7 requests; responseheaders and update are implemented by nobody here: skipped, and nothing hangs
    assert seen.count("a.requestheaders") == 7
    assert seen.count("a.response") == 7


async def test_hooks_an_addon_implements_still_run_in_chain_order(
    tmp_path: Path, backend: str, seen: list[str]
) -> None:
    addons = [
        Recorder("a", seen, extra=True),
        Recorder("b", seen, extra=False),
        Halting(),
        Recorder("c", seen, extra=False),
    ]
    with Proxy(tmp_path, addons) as proxy:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{backend}/length", proxy=proxy.url) as response:
                assert await response.read() == BIG
    hooks = [name for name in seen if not name.endswith(".update")]
    assert hooks == [
        "a.requestheaders",
        "b.requestheaders",
        "c.requestheaders",
        "a.responseheaders",  # only `a` implements it: the hook still goes through the addons
        "a.response",
        "b.response",  # then Halting stops the hook: `c` never sees the response
    ]
    assert "a.update" in seen  # `update` follows flow hooks when an addon implements it


async def test_an_async_handler_is_awaited_before_the_next_and_before_the_request_leaves(
    tmp_path: Path, backend: str, seen: list[str]
) -> None:
    with Proxy(tmp_path, [Slow(seen), After(seen), Recorder("r", seen, extra=False)]) as proxy:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.get(f"{backend}/length", proxy=proxy.url) as response:
                    assert await response.read() == BIG
    assert seen == ["r.requestheaders", "slow.request", "after.request done", "r.response"] * 2


def test_option_reads_copy_mutable_values_and_hand_out_immutable_ones() -> None:
    assert mitm_fastpath.install()
    opts = optmanager.OptManager()
    opts.add_option("words", list, ["a"], "a mutable option")
    opts.add_option("name", str, "n", "an immutable option")
    words = opts.words
    words.append("b")
    assert opts.words == ["a"]  # the option kept its value: reads are copies
    opts.update(words=["x"], name="m")
    opts.words.append("y")
    assert opts.words == ["x"]
    assert opts.name == "m"
    opts.reset()
    assert (opts.words, opts.name) == (["a"], "n")
