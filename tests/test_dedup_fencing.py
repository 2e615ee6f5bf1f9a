"""Dedup queues are fenced like the others (issue 12, item 3): the poll item carries the queue reference
(`queue_ref`: `NAME`, or `dedupq/NAME` on `/dedupq/1`), the SDK echoes it as `X-Strictq-Queue`, and the
egress proxy's lease guard looks the group's floor up in the right namespace (`<tenant>_dedupq.<name>`),
with the tenant taken from the worker's credential, never from the tag.

End to end: a real `strictq serve` (gateway, core, control stream; no health settings changed), real
`strictq proxy` processes following its control stream (one with its tenant's proxy key, one with an
operator key serving every tenant), real HTTP and HTTPS backends that record every request they get.
The claims are real: a worker polls with a short ttl, lets it lapse, and another worker gets the group
with a newer token; the zombie's calls then carry the old one.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import proxy_support
import pytest
from control_support import until, wait_proxy_saw
from proxy_support import (
    CREDENTIALS,
    PROXY_CREDENTIAL,
    Backends,
    ProxyProcess,
    WorkerClient,
    running_proxy,
    unique,
    wait_records,
    write_keys,
)
from serve_support import Serve, start_serve
from serve_support import stop as stop_serve

from access.keys import Credential
from fencing.context import BadQueueReference, CallContext, parse_queue_ref
from fencing.control_client import ControlClient, ControlState
from strictq.sdk.outbound import H_QUEUE, CallFenced, Tags

# proxy_support's module-scoped CA and per-test backends (conftest does not load them).
shared_ca, shared_backends = proxy_support.shared_ca, proxy_support.shared_backends

ROOT = Path(__file__).resolve().parent.parent
PRODUCER = "producer-secret-0123456789"  # producer-1, tenant t1
WORKERS = {"worker-1": "worker-secret-0123456789", "worker-2": "worker-secret-9876543210"}
OPERATOR = Credential("operator-1", "operator-secret-0123456789", "operator", "t1")
WORKER_T2 = Credential("worker-t2", "worker-t2-secret-0123456789", "worker", "t2")
PRODUCER_T2 = Credential("producer-t2", "producer-t2-secret-0123456789", "producer", "t2")
KEYS = [*CREDENTIALS, OPERATOR, WORKER_T2, PRODUCER_T2]
PREFIX = {"queue": "/queue/1", "dedupq": "/dedupq/1"}
CLAIM_WAIT = 20.0


# ------------------------------------------------------------------------------------------- the system
@dataclass
class System:
    serve: Serve
    proxy: ProxyProcess  # tenant t1's proxy (its proxy key): serves t1's workers only
    shared: ProxyProcess  # an operator's proxy: serves every tenant
    base: Path

    @property
    def control_url(self) -> str:
        return f"{self.serve.url}/admin/v1/control"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, shared_ca: proxy_support.UpstreamCA) -> Iterator[System]:
    base = tmp_path_factory.mktemp("dedup-fencing")
    keys = write_keys(base / "keys.toml", KEYS)
    serve = start_serve(base / "serve", "--keys", str(keys))
    try:
        with (
            running_proxy(
                base / "p-t1", "--control", serve.url, keys=keys, upstream_ca=shared_ca.path
            ) as proxy,
            running_proxy(
                base / "p-all",
                *("--control", serve.url, "--control-key-id", OPERATOR.id),
                keys=keys,
                upstream_ca=shared_ca.path,
            ) as shared,
        ):
            yield System(serve, proxy, shared, base)
    finally:
        stop_serve(serve)


class Emo:
    """The gateway's EmoDB faces, as a plain HTTP client (the SDK's poll items are these JSON objects)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def call(self, method: str, path: str, key: str, body: Any = None, **headers: str) -> Any:
        async with aiohttp.ClientSession() as session:
            data = None if body is None else orjson.dumps(body)
            async with session.request(
                method,
                self.url + path,
                data=data,
                headers={"X-BV-API-Key": key, "Content-Type": "application/json", **headers},
            ) as resp:
                answer = orjson.loads(await resp.read() or b"null")
                assert resp.status == 200, (method, path, resp.status, answer)
                return answer

    async def lapsed_claim(
        self,
        face: str,
        queue: str,
        group: str,
        producer: str = PRODUCER,
        workers: tuple[str, str] = (WORKERS["worker-1"], WORKERS["worker-2"]),
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The first worker (worker-1) claims the group's message briefly and lets the claim lapse; the
        second (worker-2) then gets the group with a newer token. Returns both poll items (a is the
        zombie's)."""
        prefix = PREFIX[face]
        await self.call("POST", f"{prefix}/{queue}/send?group={group}", producer, {"order": unique("o")})
        (a,) = await self.call("GET", f"{prefix}/{queue}/poll?ttl=0.3&limit=1", workers[0])
        deadline = time.monotonic() + CLAIM_WAIT
        while True:
            got = await self.call("GET", f"{prefix}/{queue}/poll?ttl=60&limit=1&wait=1", workers[1])
            if got:
                b: dict[str, Any] = got[0]
                assert a["id"] == b["id"] and b["token"] > a["token"], (a, b)
                return a, b
            assert time.monotonic() < deadline, "the lapsed claim never went to worker-2"


async def floor_reached(
    system: System, proxies: list[ProxyProcess], queue: str, group: str, token: int
) -> None:
    """Until the core's control stream carries the floor `token` of (queue, group) for our own subscriber
    with each proxy's key (so it sees the proxy's scope: the same events, the same ids), and then until
    that proxy has processed that same event: waits on event ids, never on time."""
    for proxy in proxies:
        key = OPERATOR.secret if proxy is system.shared else PROXY_CREDENTIAL.secret
        observer = ControlClient(system.control_url, key, reconnect_min=0.05)
        observer.start()
        try:
            await until(partial(has_floor, observer.state, queue, group, token), 15, what=f"floor of {queue}")
            await wait_proxy_saw(proxy.admin_url, observer.state.last_event_id, within=15)
        finally:
            await observer.stop()


def has_floor(state: ControlState, queue: str, group: str, token: int) -> bool:
    return state.floor(queue, group) >= token


def client(proxy: ProxyProcess, worker: str, tags: Tags | None = None) -> WorkerClient:
    """A worker's tagged outbound session through the proxy, with its credential from this key file."""
    secret = next(c.secret for c in KEYS if c.id == worker)
    return WorkerClient(proxy, worker, secret=secret, tags=tags)


def attempt_tags(worker_queue: str, item: dict[str, Any], group: str) -> Tags:
    """The tags the SDK's worker builds for an attempt at a poll item (strictq.sdk.worker)."""
    return Tags.for_item(worker_queue, item, group, int(item.get("attempt") or 1))


async def assert_refused_stale(proxy: ProxyProcess, worker: str, tags: Tags, backends: Backends) -> None:
    """Through the SDK's tagged session: CallFenced (stale-lease, 409), and no backend saw anything. Each
    backend gets a fresh copy of the attempt (a fenced attempt makes no further calls at all)."""
    for backend in backends.all():
        backends.reset()
        attempt = Tags(tags.queue, tags.message_id, tags.group, tags.token, tags.attempt)
        async with client(proxy, worker, attempt) as session:
            with pytest.raises(CallFenced) as fenced:
                await session.call("POST", f"{backend.url}/charge", json={"order": 7})
        assert (fenced.value.action, fenced.value.code, fenced.value.status) == (
            "stale-lease",
            "stale_lease",
            409,
        )
        assert backend.accepted == 0 and backend.seen == [], backend.url  # never reached the backend


async def assert_passes(
    proxy: ProxyProcess, worker: str, headers: dict[str, str], backends: Backends
) -> None:
    """A tagged call (raw tag headers) that reaches both backends, tags stripped."""
    for backend in backends.all():
        backends.reset()
        async with client(proxy, worker) as session:
            reply = await session.call("POST", f"{backend.url}/charge", json={"order": 7}, headers=headers)
        assert reply.status == 200, (backend.url, reply)
        assert [s.path for s in backend.seen] == ["/charge"]
        assert backend.seen[0].tag_headers == []


# ------------------------------------------------------------------------------ the reference, parsed
def test_a_queue_reference_names_a_face_and_a_name_never_a_tenant() -> None:
    assert parse_queue_ref("orders") == ("queue", "orders")  # what every SDK sent before faces
    assert parse_queue_ref("queue/orders") == ("queue", "orders")
    assert parse_queue_ref("dedupq/orders") == ("dedupq", "orders")
    assert parse_queue_ref("dedupq/t2_dedupq.orders") == ("dedupq", "t2_dedupq.orders")  # just a name
    for bad in ("sqs/orders", "t2/orders", "dedupq/", "dedupq/a/b", "/orders", "DEDUPQ/orders"):
        with pytest.raises(BadQueueReference):
            parse_queue_ref(bad)

    def internal(tenant: str, ref: str) -> str | None:
        face, name = parse_queue_ref(ref)
        return CallContext(started=0.0, tenant=tenant, queue=name, face=face).internal_queue

    assert internal("t1", "orders") == "t1.orders"
    assert internal("t1", "dedupq/orders") == "t1_dedupq.orders"
    assert internal("t1", "dedupq/t2_dedupq.orders") == "t1_dedupq.t2_dedupq.orders"  # still t1's
    assert internal("t1", "t2.orders") == "t1.t2.orders"
    assert CallContext(started=0.0, tenant="t1", queue="orders").internal_queue == "t1.orders"  # no face


def test_the_sdk_echoes_the_poll_items_reference_and_falls_back_to_its_queue_name() -> None:
    item = {"id": "m-1", "token": 42, "attempt": 2, "queue_ref": "dedupq/orders"}
    assert Tags.for_item("orders", item, "g1", 2).next_headers()[H_QUEUE] == "dedupq/orders"
    old_gateway = {"id": "m-1", "token": 42}  # a gateway without `queue_ref`: the plain queue face
    assert Tags.for_item("orders", old_gateway, "g1", 1).next_headers()[H_QUEUE] == "orders"


# ------------------------------------------------------------------------------------------ end to end
async def test_a_stale_lease_for_a_dedup_queue_message_is_refused_at_the_proxy(
    system: System, shared_backends: Backends
) -> None:
    queue, group = unique("dd"), "g1"
    emo = Emo(system.serve.url)
    a, b = await emo.lapsed_claim("dedupq", queue, group)
    assert a["queue_ref"] == b["queue_ref"] == f"dedupq/{queue}"
    await floor_reached(system, [system.proxy, system.shared], f"t1_dedupq.{queue}", group, b["token"])
    for proxy in (system.proxy, system.shared):
        # The zombie (worker-1) still believes it holds the message: its calls carry the old token.
        await assert_refused_stale(proxy, "worker-1", attempt_tags(queue, a, group), shared_backends)
        # The claim's holder passes with the same reference.
        await assert_passes(proxy, "worker-2", attempt_tags(queue, b, group).next_headers(), shared_backends)

    # The wire log names the dedup queue: its name and the face, as the gateway's delivery records do.
    records = await wait_records(
        system.proxy.wirelog_dir,
        lambda rs: sum(r["message_id"] == a["id"] for r in rs) >= 4,
    )
    mine = [r for r in records if r["message_id"] == a["id"]]
    stale = [r for r in mine if r["action"] == "stale-lease"]
    assert {(r["worker"], r["lease"], r["queue"], r["face"], r["tenant"]) for r in stale} == {
        ("worker-1", a["token"], queue, "dedupq", "t1")
    }
    assert len(stale) == 2 and all(r["response"]["status"] == 409 for r in stale)
    assert f"dedupq/{queue}" in orjson.loads(stale[0]["response"]["body"])["message"]
    passed = [r for r in mine if r["action"] == "pass"]
    assert {(r["worker"], r["lease"], r["face"]) for r in passed} == {("worker-2", b["token"], "dedupq")}

    # `strictq wirelog grep --queue NAME` finds them (as it finds the delivery records of that name).
    out = await asyncio.to_thread(
        subprocess.run,
        [
            *(sys.executable, "-m", "strictq", "wirelog", "grep", "--dir", str(system.proxy.wirelog_dir)),
            *("--queue", queue, "--action", "stale-lease", "--json"),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    found = [orjson.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert {r["id"] for r in found} == {r["id"] for r in stale}

    # `strictq replay` assembles the message's story from the gateway's and the proxy's records alike:
    # the dedup face (so its replay queue is a dedup queue), both attempts, the zombie's refused calls
    # attached to its own attempt.
    from fencing.replay.stories import read_stories

    async def story_complete() -> Any:
        deadline = time.monotonic() + 15
        while True:
            stories, _, _ = await asyncio.to_thread(read_stories, system.base, message_ids=[a["id"]])
            story = stories.get(a["id"])
            if story is not None and len(story.attempts) == 2:
                return story
            assert time.monotonic() < deadline, f"no complete story for {a['id']}: {story}"
            await asyncio.sleep(0.2)

    story = await story_complete()
    assert (story.queue, story.face, story.group) == (queue, "dedupq", group)
    by_lease = {attempt.lease: attempt for attempt in story.attempts}
    # (the recordings of both proxies: two backends each)
    assert [c.action for c in by_lease[a["token"]].calls] == ["stale-lease"] * 4
    assert [c.action for c in by_lease[b["token"]].calls] == ["pass"] * 4


async def test_the_plain_queue_face_still_holds_with_new_and_old_style_tags(
    system: System, shared_backends: Backends
) -> None:
    queue, group = unique("pq"), "g7"
    emo = Emo(system.serve.url)
    a, b = await emo.lapsed_claim("queue", queue, group)
    assert a["queue_ref"] == queue  # the plain face's reference is the bare name, as tags always were
    await floor_reached(system, [system.proxy], f"t1.{queue}", group, b["token"])
    await assert_refused_stale(system.proxy, "worker-1", attempt_tags(queue, a, group), shared_backends)
    # An older SDK's tags (no reference from the poll item: the worker's queue name) mean the plain face.
    old_style = Tags(queue, a["id"], group, a["token"], 1)
    await assert_refused_stale(system.proxy, "worker-1", old_style, shared_backends)
    explicit = Tags(f"queue/{queue}", a["id"], group, a["token"], 1)
    await assert_refused_stale(system.proxy, "worker-1", explicit, shared_backends)
    holder = Tags(queue, b["id"], group, b["token"], 2)
    await assert_passes(system.proxy, "worker-2", holder.next_headers(), shared_backends)
    # The dedup queue of the same name is another queue: its floors are not the plain queue's.
    await assert_passes(
        system.proxy,
        "worker-1",
        Tags(f"dedupq/{queue}", a["id"], group, a["token"], 1).next_headers(),
        shared_backends,
    )
    records = await wait_records(
        system.proxy.wirelog_dir,
        lambda rs: sum(r["message_id"] == a["id"] and r["action"] == "stale-lease" for r in rs) >= 6,
    )
    stale = [r for r in records if r["message_id"] == a["id"] and r["action"] == "stale-lease"]
    assert {(r["queue"], r["face"]) for r in stale} == {(queue, "queue")}


async def test_an_unknown_face_in_the_reference_is_a_400_that_reaches_nobody(
    system: System, shared_backends: Backends
) -> None:
    marker = unique("bad")
    headers = Tags(f"sqs/{marker}", marker, "g1", 5, 1).next_headers()
    for backend in shared_backends.all():
        shared_backends.reset()
        async with client(system.proxy, "worker-1") as session:
            reply = await session.call("POST", f"{backend.url}/charge", json={}, headers=headers)
        assert reply.status == 400, reply
        body = reply.json()
        assert body["code"] == "malformed_tags" and "X-Strictq-Queue" in body["message"], body
        assert "unknown face 'sqs'" in body["message"], body
        assert backend.accepted == 0 and backend.seen == []


async def test_a_worker_of_another_tenant_cannot_reach_a_tenants_floors(
    system: System, shared_backends: Backends
) -> None:
    """Tenant t1 holds a dedup queue with a raised floor. A t2 worker, through the operator's proxy that
    serves both, names that queue every way it can, with a lease below t1's floor: t1's floor never
    applies to it (its reference only ever means its own tenant's queue) and nothing changes for t1."""
    queue, group = unique("xt"), "g1"
    emo = Emo(system.serve.url)
    a, b = await emo.lapsed_claim("dedupq", queue, group)
    await floor_reached(system, [system.shared], f"t1_dedupq.{queue}", group, b["token"])
    for ref in (f"dedupq/{queue}", queue, f"dedupq/t1_dedupq.{queue}", f"t1_dedupq.{queue}", f"t1.{queue}"):
        tags = Tags(ref, a["id"], group, a["token"], 1)
        await assert_passes(system.shared, WORKER_T2.id, tags.next_headers(), shared_backends)
        # t2's workers carry their own credential: a proxy serving t1 only does not let them in at all.
        shared_backends.reset()
        async with client(system.proxy, WORKER_T2.id, tags) as session:
            reply = await session.call("POST", f"{shared_backends.http.url}/charge", json={})
        assert reply.status == 407 and reply.json()["code"] == "tenant_not_served", reply
        assert shared_backends.http.accepted == 0 and shared_backends.http.seen == []
    # t2 with its own dedup queue of the same name: its own floor applies, t1's does not.
    t2_worker = WORKER_T2.secret
    c, d = await emo.lapsed_claim("dedupq", queue, group, PRODUCER_T2.secret, (t2_worker, t2_worker))
    await floor_reached(system, [system.shared], f"t2_dedupq.{queue}", group, d["token"])
    t2_zombie = Tags(f"dedupq/{queue}", c["id"], group, c["token"], 1)
    await assert_refused_stale(system.shared, WORKER_T2.id, t2_zombie, shared_backends)
    # Nothing changed for t1: its zombie is still refused, its holder still passes and can ack.
    await assert_refused_stale(system.shared, "worker-1", attempt_tags(queue, a, group), shared_backends)
    await assert_passes(
        system.shared, "worker-2", attempt_tags(queue, b, group).next_headers(), shared_backends
    )
    await emo.call(
        "POST",
        f"/dedupq/1/{queue}/ack",
        WORKERS["worker-2"],
        [b["id"]],
        **{"X-Strictq-Lease": str(b["token"])},
    )
    records = await wait_records(
        system.shared.wirelog_dir,
        lambda rs: sum(r["worker"] == WORKER_T2.id and r["message_id"] == a["id"] for r in rs) >= 10,
    )
    t2_calls = [r for r in records if r["worker"] == WORKER_T2.id and r["message_id"] == a["id"]]
    assert {r["tenant"] for r in t2_calls} == {"t2"} and {r["action"] for r in t2_calls} == {"pass"}
