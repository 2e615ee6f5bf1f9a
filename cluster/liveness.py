"""Proof that a silent node is dead, so its partitions (and the master's lease) move long before its heartbeat
times out.

A heartbeat that stops says only that a node is silent: it may be dead, paused (SIGSTOP, a long GC or swap
stall on a loaded machine) or cut off. Waiting out cluster.layout.NODE_TTL (2.5 s) covers all of these, and
is what a failover cost. A killed process leaves one more trace: the kernel closes its listening socket, so
a TCP connect to its internal API is refused at once, while a paused or busy process's socket still accepts
(the kernel completes the handshake). So every node watches the others' heartbeats; one more than
SUSPECT_AFTER late is probed with a bare TCP connect to its announced URL, and a refusal marks that
incarnation dead. Only a refusal counts (a timeout or an unreachable network proves nothing), and only for
a URL this process has reached before in the same incarnation (a URL that never answered here, say a
loopback address announced from another machine, proves nothing either). A node without a URL is never
proven dead: it is judged by NODE_TTL alone, as before. Two refusals PROBE_EVERY apart are needed (one
may be a full accept queue on a kernel that resets then), and none counts once a newer heartbeat came
while probing. A newer heartbeat (a higher revision, not a watch's redelivery of the last one) of a marked
incarnation clears the mark (the refusal was wrong, e.g. the API restarted): the master then treats it as
any live node. The proof holds only where the announced URL reaches the node's own listening socket (not a
proxy or load balancer that refuses for it: docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from .kv_mirror import KvMirror
from .layout import NODE_TTL
from .ownership import NodeInfo, RecordError

log = logging.getLogger("strictq.cluster")
# Heartbeats come every cluster.node.HEARTBEAT (0.25 s): one this late has missed at least one beat. A probe
# of a live node costs one TCP connect, so suspecting early is cheap; only a refusal moves anything.
SUSPECT_AFTER = 0.4
LOOK_EVERY = 0.05  # how often the heartbeats' ages are looked at (no I/O unless one is late)
PROBE_TIMEOUT = 0.5  # a connect that takes longer proves nothing (the next look tries again)
PROBE_EVERY = 0.1  # at most this often per late node (a paused one accepts, and is probed again)
REFUSALS_TO_PROVE = 2  # in a row, PROBE_EVERY apart, with no heartbeat between
REACH_EVERY = 1.0  # at most this often per URL not reached yet (one that never answers costs little)


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    incarnation: str
    host: str
    port: int


def target(info: NodeInfo) -> Target | None:
    """Where to probe a node: its internal API's host and port (None: no URL to probe)."""
    if not info.url:
        return None
    try:
        parts = urlsplit(info.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return Target(info.node, info.incarnation, parts.hostname, port)


async def refused(where: Target) -> bool | None:
    """True: the connect was refused (nothing listens: the process is gone); False: it connected; None: no
    answer either way in PROBE_TIMEOUT (proves nothing)."""
    # Each address of the name on its own: a name of several (localhost: ::1 and 127.0.0.1) is refused only
    # if every one refuses, and the loop's own multi-address error (uvloop's differs) is never parsed.
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            found = await asyncio.get_running_loop().getaddrinfo(
                where.host, where.port, type=socket.SOCK_STREAM
            )
            answers = [await _connect(str(address[4][0]), where.port) for address in found]
    except (OSError, TimeoutError):
        return None
    if False in answers:
        return False
    return True if answers and all(answers) else None


async def _connect(host: str, port: int) -> bool | None:
    """True: refused; False: connected; None: another error (proves nothing)."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    except OSError:
        return None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class Liveness:
    """Which silent nodes are proven dead, from `nodes` (the heartbeat bucket's mirror). `on_dead` is
    called (without blocking) each time one is: the master looks again at once."""

    def __init__(
        self,
        nodes: KvMirror,
        on_dead: Callable[[str], None] = lambda node: None,
        probe: Callable[[Target], Awaitable[bool | None]] | None = None,
    ) -> None:
        self._nodes = nodes
        self._on_dead = on_dead
        self._probe = probe or refused
        self._reached: set[Target] = set()  # connected to while its heartbeat was fresh
        self._dead: dict[tuple[str, str], int] = {}  # (node, incarnation) -> the revision it died after
        self._refusals: dict[Target, int] = {}  # refusals in a row since the last heartbeat
        self._parsed: dict[str, tuple[int, NodeInfo]] = {}  # node -> (revision, record)
        self._probing: set[Target] = set()
        self._next: dict[Target, float] = {}  # no probe of it before then (monotonic)
        self._tasks: set[asyncio.Task[None]] = set()

    def is_dead(self, node: str, incarnation: str) -> bool:
        return (node, incarnation) in self._dead

    def reached(self, node: str, incarnation: str) -> bool:
        """Whether this process has connected to that incarnation's API (only then can it be proven dead)."""
        return any(t.node == node and t.incarnation == incarnation for t in self._reached)

    async def run(self) -> None:
        try:
            while True:
                self.look()
                await asyncio.sleep(LOOK_EVERY)
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def look(self) -> None:
        """Start a probe of each node whose heartbeat is late (or not yet reached once); forget marks a
        newer heartbeat contradicts."""
        now = time.monotonic()
        current: set[tuple[str, str]] = set()
        for name, entry in list(self._nodes.entries.items()):
            info = self._info(name, entry.revision, entry.value)
            if info is None:
                continue
            current.add((info.node, info.incarnation))
            marked = self._dead.get((info.node, info.incarnation))
            if marked is not None:
                if entry.revision > marked:
                    del self._dead[(info.node, info.incarnation)]
                    log.warning("%s heart-beats again after its API refused connections", info.node)
                continue
            where = target(info)
            age = now - entry.heard_at
            if where is None or where in self._probing or age > NODE_TTL or now < self._next.get(where, 0):
                continue  # NODE_TTL judges it anyway
            if age <= SUSPECT_AFTER:
                self._refusals.pop(where, None)  # heart-beating: earlier refusals count no more
            if where not in self._reached and age <= SUSPECT_AFTER:
                self._start(name, where, entry.revision, fresh=True)
            elif where in self._reached and age > SUSPECT_AFTER:
                self._start(name, where, entry.revision, fresh=False)
        self._forget(current)

    def _forget(self, current: set[tuple[str, str]]) -> None:
        """Drop what is kept of incarnations no record names any more (restarted nodes), now and then."""
        if len(self._reached) + len(self._next) + len(self._dead) <= 4 * len(current) + 16:
            return
        self._reached = {t for t in self._reached if (t.node, t.incarnation) in current}
        self._next = {t: at for t, at in self._next.items() if (t.node, t.incarnation) in current}
        self._refusals = {t: n for t, n in self._refusals.items() if (t.node, t.incarnation) in current}
        self._dead = {key: at for key, at in self._dead.items() if key in current}

    def _info(self, name: str, revision: int, raw: bytes) -> NodeInfo | None:
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == revision:
            return cached[1]
        try:
            info = NodeInfo.from_json(raw)
        except RecordError:
            return None
        self._parsed[name] = (revision, info)
        return info

    def _start(self, name: str, where: Target, revision: int, *, fresh: bool) -> None:
        self._probing.add(where)
        self._next[where] = time.monotonic() + (REACH_EVERY if fresh else PROBE_EVERY)
        checking = self._check(name, where, revision, fresh)
        task = asyncio.create_task(checking, name=f"strictq-probe-{where.node}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, name: str, where: Target, revision: int, fresh: bool) -> None:
        try:
            answer = await self._probe(where)
        except Exception:  # a probe's bug must not stop the watch; NODE_TTL still judges
            log.exception("probing %s", where.node)
            answer = None
        finally:
            self._probing.discard(where)
        if answer is False:
            self._reached.add(where)
            if fresh:  # reached: a late heartbeat is probed at once from now on
                self._next.pop(where, None)
        elif answer is True and not fresh:
            now = self._nodes.entries.get(name)
            if now is None or now.revision != revision:
                return  # a newer heartbeat came while probing (or the key went): the refusal is stale
            refusals = self._refusals[where] = self._refusals.get(where, 0) + 1
            if refusals < REFUSALS_TO_PROVE:
                return
            self._dead[(where.node, where.incarnation)] = revision
            log.warning(
                "%s (incarnation %s) is dead: no heartbeat for %.2fs and %s:%d refuses connections",
                where.node,
                where.incarnation,
                time.monotonic() - now.heard_at,
                where.host,
                where.port,
            )
            self._on_dead(where.node)
