"""The noisy-neighbour test (issue 17), against a real `strictq serve` over TLS with the SDK's client.

- At the edge: tenant A offers 10x its per-tenant send limit while tenant B sends steadily. A is throttled
  with the documented error (429 `throttled`), everything of A's that was accepted reaches A's worker, and
  B's AgeOfFirstAttempt (send to first delivery) stays within 2x of its baseline, B alone.
- In one queue shared by both (groups `a:...` and `b:...`, one worker of fixed capacity): with the queue's
  fairness on, B is served between A's groups instead of behind A's whole backlog; the same run with
  fairness off is the control. Nothing is lost and no group's order breaks in either.

The 2x bound is on medians of a few hundred samples; both sides are floored at 25 ms, the resolution of a
loaded 2-core machine's scheduling (a baseline of 3 ms against 7 ms says nothing about fairness).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from gateway_support import CREDENTIALS
from proxy_support import write_keys
from serve_support import Serve, start_serve

from scenarios.noisy_neighbour import Endpoint, TenantKeys, edge_flood, shared_queue

pytestmark = pytest.mark.timeout(240)
A_LIMIT = 40.0  # A's (and every tenant's) send limit, msg/s
RESOLUTION = 0.025


def secret(key_id: str) -> str:
    return next(c.secret for c in CREDENTIALS if c.id == key_id)


def serve_with(tmp_path: Path, *flags: str) -> Iterator[Serve]:
    keys = write_keys(tmp_path / "keys.toml", CREDENTIALS)  # tenants t1 (A) and t2 (B)
    server = start_serve(tmp_path / "serve", "--keys", str(keys), *flags, tls=True)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Serve]:
    yield from serve_with(tmp_path, "--tenant-rate", str(A_LIMIT), "--tenant-burst", str(int(A_LIMIT)))


@pytest.fixture
def unlimited(tmp_path: Path) -> Iterator[Serve]:
    yield from serve_with(tmp_path)


def endpoint_of(serve: Serve) -> Endpoint:
    return Endpoint(serve.url, str(serve.ca) if serve.ca is not None else None)


async def test_a_tenant_flooding_at_ten_times_its_limit_leaves_the_other_tenants_wait_alone(
    limited: Serve,
) -> None:
    a = TenantKeys(producer=secret("producer-1"), worker=secret("worker-1"), queue="flood")
    b = TenantKeys(producer=secret("other-1"), worker=secret("other-1"), queue="steady")
    measured: list[tuple[float, float]] = []
    for _ in range(2):
        result = await edge_flood(
            endpoint_of(limited), a, b, a_limit=A_LIMIT, factor=10, b_rate=20, seconds=3
        )
        # A was throttled, with the documented error, and got about its limit in.
        assert set(result.a_refused) == {"throttled"}, result.a_refused
        assert result.a_refused["throttled"] > result.a_accepted
        assert result.a_accepted <= A_LIMIT * (result.a_seconds + 1) + A_LIMIT  # rate x time + the burst
        # Nothing accepted is lost, no order broken.
        assert (result.a_lost, result.b_lost, result.order_violations) == (0, 0, 0)
        assert len(result.b_ages["flood"]) >= 50
        measured.append((result.age("baseline"), result.age("flood")))
        if within_twice(*measured[-1]):
            break
        # Measured once more: the baseline and the flood are two 3 s windows, and on a shared 2-core
        # machine another test's burst (a JVM starting, a cluster electing) can take one of them. A flood
        # that really slows B down fails both.
    # B's AgeOfFirstAttempt during the flood stays within 2x of its baseline.
    assert within_twice(*measured[-1]), measured


def within_twice(baseline: float, flooded: float) -> bool:
    """B's median wait during the flood within 2x of B alone, both floored at the machine's resolution."""
    return max(flooded, RESOLUTION) <= 2 * max(baseline, RESOLUTION)


async def test_in_a_shared_queue_fairness_serves_the_quiet_tenant_between_the_floods_groups(
    unlimited: Serve,
) -> None:
    serve = unlimited
    admin = secret("admin-1")
    keys = TenantKeys(producer=admin, worker=admin, queue="shared")
    endpoint = endpoint_of(serve)
    figures = {}
    for fair in (True, False):
        queue = f"shared-{'fair' if fair else 'plain'}"
        settings = {"tenant_separator": ":" if fair else "", "group_in_flight": 1 if fair else 0}
        status, created = serve.call("POST", f"/queue/1/{queue}/send", admin, {"hello": True})
        assert status == 200, created
        status, answer = serve.call("PUT", f"/admin/v1/queues/{queue}/protections", admin, settings)
        assert status == 200 and answer["tenant_separator"] == settings["tenant_separator"], answer
        assert serve.call("DELETE", f"/queue/1/{queue}", admin)[0] == 200  # EmoDB's purge
        figures[fair] = await shared_queue(
            endpoint,
            TenantKeys(keys.producer, keys.worker, queue),
            fair=fair,
            backlog=240,
            service_time=0.01,
            b_rate=10,
            seconds=1.5,
        )
    fair, plain = figures[True], figures[False]
    for run in (fair, plain):
        assert (run.lost, run.order_violations) == (0, 0)
        assert len(run.b_ages) == 15
    # Oldest first, B waits behind A's backlog (2.4 s of work); taking turns, it waits for one message.
    assert fair.age(0.5) * 4 < plain.age(0.5), (fair.b_ages, plain.b_ages)
    assert orjson.dumps(fair.b_ages)  # (the figures are the benchmark's; here only their relation)
