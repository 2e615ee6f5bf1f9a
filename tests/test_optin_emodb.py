"""Plain EmoDB clients keep EmoDB semantics with failure management on (issue 12), the capability
declaration's bad input, and garbled probe results.

Real HTTP through the in-process gateway (health_support: TLS on 127.0.0.1, fenced after 3 failures,
probes every 0.2 s). `Health.poll` declares `results, probes` as the SDK does; `capabilities=None` polls
as a plain EmoDB client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import ServerProcess
from health_support import CAPABILITIES_HEADER, QUEUE, TIMEOUT, Health, until

from queue_core.client import QueueClient, QueueClientError

LAPSE_TTL = 0.3


async def no_claims(h: Health, queue: str = f"t1.{QUEUE}") -> None:
    deadline = time.monotonic() + TIMEOUT
    while (await h.service.metrics(queue)).in_flight:
        assert time.monotonic() < deadline, "the claims never lapsed"
        await asyncio.sleep(0.02)


async def test_a_plain_emodb_client_never_gets_a_probe(health: Health) -> None:
    """worker-1 and worker-2 take part and fail with one signature (shared: the queue is checked with
    probes); worker-3 polls as a plain EmoDB client and lets its claims lapse. Probes go out to the
    participants; worker-3 gets only real messages, whatever happens."""
    h = health
    for n in range(4):
        await h.send(f"g{n}", {"n": n})
    for worker in ("worker-1", "worker-2"):
        (item, *_) = await h.poll(worker, limit=1)
        await h.fail(worker, item, "db down", signature="POST db 5xx")
    await until(lambda: "shared-failure" in h.event_names(), what="the shared failure")
    await until(lambda: "probe" in h.event_names(), what="probes for the participants")
    seen_real = 0
    for _ in range(15):
        items = await h.poll("worker-3", limit=10, ttl=LAPSE_TTL, capabilities=None)
        assert not any(i.get("probe") or str(i["id"]).startswith("probe-") for i in items), items
        seen_real += len(items)
        await no_claims(h)  # lets them lapse: never failure evidence, never a reason to probe it
    assert seen_real > 0
    assert not [e for e in h.manager.events() if e.get("worker") == "worker-3"]
    assert all(w["worker"] != "worker-3" for w in (await h.status())["workers"])


async def test_two_plain_clients_lapsing_make_no_shared_signature(health: Health) -> None:
    """The issue's case: two plain EmoDB clients each let a claim lapse. Before, `claim expired` became a
    shared signature and the next poll handed a plain client a probe."""
    h = health
    for n in range(2):
        await h.send(f"g{n}", {"n": n})
    for worker in ("worker-1", "worker-2"):
        assert await h.poll(worker, limit=1, ttl=LAPSE_TTL, capabilities=None)
    await no_claims(h)
    items = await h.poll("worker-1", limit=10, ttl=30, capabilities=None)
    assert len(items) == 2 and not any(i.get("probe") for i in items)
    assert await h.poll("worker-2", capabilities=None) == []  # nothing left, and no probe either
    assert not [e for e in h.manager.events() if e["event"] in ("shared-failure", "probe", "fence")]


async def test_a_health_fence_never_withholds_messages_from_a_plain_poll(health: Health) -> None:
    """worker-1 takes part, fails three times and is fenced: its SDK polls get only probes. A plain poll
    of the same credential (boto3, curl) is not held by that health fence: only the proxy acts on it."""
    h = health
    for n in range(4):
        await h.send(f"g{n}", {"n": n})
    for _ in range(3):
        (item, *_) = await h.poll("worker-1", limit=1)
        await h.fail("worker-1", item, "bug", signature=f"own bug {item['id']}")
    await until(lambda: h.manager.monitor.blocked("worker-1"), what="the fence")
    assert all(i.get("probe") for i in await h.poll("worker-1"))
    plain = await h.poll("worker-1", capabilities=None)
    assert plain and not any(i.get("probe") for i in plain)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "value",
    [
        "results,,probes",  # an empty token between commas
        "results, ",  # a trailing empty token
        "résults",  # outside [a-z0-9_-]
        "results probes",  # a space inside a token
        ",".join(f"t{i}" for i in range(17)),  # more than 16 tokens
        "x" * 257,  # over 256 bytes
    ],
)
async def test_a_malformed_declaration_is_a_400_naming_the_header(health: Health, value: str) -> None:
    status, body = await health.call(
        "GET", f"/queue/1/{QUEUE}/poll", "worker-1", headers={CAPABILITIES_HEADER: value}
    )
    assert status == 400, body
    assert body["error"]["code"] == "invalid_argument"
    assert body["error"]["details"]["field"] == CAPABILITIES_HEADER
    assert CAPABILITIES_HEADER in body["error"]["message"]


@pytest.mark.parametrize("value", ["RESULTS , Probes", "results, probes, future-thing", "", "probes"])
async def test_well_formed_declarations_are_taken(health: Health, value: str) -> None:
    """Case-insensitive, whitespace around tokens, unknown tokens ignored, a blank header declares
    nothing; `probes` alone is not taking part (a probe needs a result)."""
    await health.send("g", {"n": 1})
    status, body = await health.call(
        "GET", f"/queue/1/{QUEUE}/poll", "worker-1", headers={CAPABILITIES_HEADER: value}
    )
    assert status == 200 and len(body) == 1, body
    participates = value.strip().lower().replace(" ", "").startswith("results")
    assert health.service.core.participates("worker-1") == participates


async def test_the_internal_api_checks_capabilities(server: ServerProcess) -> None:
    """`"capabilities": [...]` on the internal API's receive: the same rules, 400 naming the field."""
    async with QueueClient(server.url) as client:
        await client.send("jobs", [{"body": "m", "group": "g"}], create=True)
        for bad in (["results,probes"], ["", "results"], [f"t{i}" for i in range(17)], "results"):
            with pytest.raises(QueueClientError) as caught:
                await client.request("POST", "/v1/queues/jobs/receive", {"worker": "w1", "capabilities": bad})
            assert caught.value.status == 400, bad
            assert (caught.value.details or {}).get("field") == "capabilities", bad
        (message,) = await client.receive("jobs", worker="w1", ttl=30, capabilities=["Results", "probes"])
        assert message["body"] == "m"


async def test_a_garbled_probe_result_fails_the_probe(health: Health) -> None:
    """A worker that declared probes answers one with garbage: the probe counts as failed (an event
    names why), the request is answered, nothing crashes. Garbage for a real message is still a 400."""
    h = health
    for n in range(4):
        await h.send(f"g{n}", {"n": n})
    for _ in range(3):
        (item, *_) = await h.poll("worker-1", limit=1)
        await h.fail("worker-1", item, "bug", signature=f"own bug {item['id']}")
    await until(lambda: h.manager.monitor.blocked("worker-1"), what="the fence")
    probe = await h.probe("worker-1")
    garbage: dict[str, Any] = {"id": probe["id"], "token": "banana", "outcome": "yes!", "steps": 7}
    (outcome,) = await h.report("worker-1", [garbage])
    assert outcome["status"] == "ok"
    failed = [e for e in h.manager.events() if e["event"] == "probe-failed"]
    assert failed and failed[-1]["probe_id"] == probe["id"]
    assert failed[-1]["reason"].startswith("unreadable probe result")
    assert h.manager.monitor.blocked("worker-1")  # still fenced: a garbled answer is no pass
    (real, *_) = await h.poll("worker-2", limit=1)
    status, body = await h.call(
        "POST",
        f"/queue/1/{QUEUE}/results",
        "worker-2",
        {"results": [{"id": real["id"], "token": real["token"], "outcome": "yes!"}]},
    )
    assert status == 400 and body["error"]["details"]["field"] == "outcome"


def test_a_garbled_result_that_cannot_be_forwarded_as_sent_stays_garbled() -> None:
    """`strictq serve --queue-server` forwards a garbled result as it was sent, so the queue server decides
    on it the same way; one holding a lone surrogate cannot be sent as JSON, and must not become a 500."""
    import orjson

    from queue_core.results import parse_results, result_json

    (garbled,) = parse_results(
        {"results": [{"id": "probe-1-1", "outcome": "failed", "reason": "bad \ud800"}]}
    )
    assert garbled.error is not None
    forwarded = orjson.loads(orjson.dumps(result_json(garbled)))
    (again,) = parse_results({"results": [forwarded]})
    assert again.message_id == "probe-1-1" and again.error is not None
