"""The state-transfer benchmark (issue 18): how long moving groups' local state takes, per MiB.

Each size runs against its own `strictq serve` (HTTPS, queue core in-process, no egress proxy). Groups of
64 KiB of local state each (1, 4 and 16 MiB in all: 16, 64 and 256 groups), one message waiting per group:
1. the donor SDK worker (`Worker(state_limit=...)`) holds the state; an admin moves every group away from
   it (`POST /admin/v1/queues/{q}/handover`): the clock starts;
2. its next poll answer names the groups (`X-Strictq-Handover`); it uploads their state (`PUT
   /queue/1/{q}/state`, requests under the edge's body cap, each answered once durable) and forgets it;
3. a second SDK worker (or the donor: whoever claims a group first) gets each group's state inline in its
   poll items: the clock stops when every group's message was processed with its transferred state.

Reported: end-to-end seconds, the export share (hand_over to the donor's last upload answered), MiB/s and
milliseconds per MiB. Both workers run in this process, the server in its own, on the same machine.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

from strictq.sdk import ClientConfig, EmoClient, Message, Worker

from .scenarios import Progress, Settings, measured, provenance
from .servers import GatewayServer

GROUP_STATE = 64 * 1024  # bytes of local state per group
QUEUE = "state-bench"


def run_state_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    sizes = (1, 4) if st.quick else (1, 4, 16)
    runs: list[dict[str, Any]] = []
    for mib in sizes:
        work = st.work_dir / f"state-{mib}"
        work.mkdir(parents=True, exist_ok=True)
        server = GatewayServer(
            work / "data",
            st.out_dir / f"state-{mib}.log",
            extra_args=["--no-proxy", "--keys", str(_key_file(work / "keys.toml"))],
        )
        server.start()
        try:
            figures = asyncio.run(_transfer(server.url, server.ca or None, server.credentials(), mib))
        finally:
            server.stop()
        runs.append(figures)
        progress(
            f"state: {mib} MiB in {figures['groups']} groups: {figures['seconds']:.2f} s end to end"
            f" ({figures['ms_per_mib']:.0f} ms/MiB; export {figures['export_seconds']:.2f} s)"
        )
    return {"group_state": GROUP_STATE, "runs": runs, **provenance(st, started)}


async def _transfer(url: str, ca: str | None, keys: dict[str, dict[str, str]], mib: int) -> dict[str, Any]:
    groups = [f"g{i:04d}" for i in range(mib * 1024 * 1024 // GROUP_STATE)]

    def config(key: str) -> ClientConfig:
        secret = keys[key]["secret"]
        return ClientConfig(url=url, ca_file=ca, api_key=secret, worker_id=key, worker_secret=secret)

    async with EmoClient(config("producer-1"), keys["producer-1"]["secret"]) as producer:
        for start in range(0, len(groups), 32):
            await asyncio.gather(
                *(producer.send(QUEUE, {"group": g}, group=g) for g in groups[start : start + 32])
            )
    imported: set[str] = set()
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        # Whoever claims a group next gets its state inline: usually the second worker, sometimes the
        # donor itself (it forgot its copy on upload, so it too starts from the transferred state).
        if len(msg.state.get("blob", "")) >= GROUP_STATE - 64:
            imported.add(msg.group)
        if len(imported) == len(groups):
            done.set()

    limit = 2 * GROUP_STATE
    donor = Worker(QUEUE, handler, config=config("worker-1"), wait=1.0, state_limit=limit)
    recipient = Worker(QUEUE, handler, config=config("worker-2"), wait=1.0, limit=100, state_limit=limit)
    assert donor.local_state is not None
    for group in groups:
        donor.local_state.groups[group] = {"blob": "x" * (GROUP_STATE - 16)}
    admin = EmoClient(config("admin-1"), keys["admin-1"]["secret"], prefix="")
    async with admin:
        began = time.perf_counter()
        await admin._call(
            "POST", f"/admin/v1/queues/{QUEUE}/handover", body={"from": "worker-1", "groups": groups}
        )
    tasks = [asyncio.create_task(donor.run()), asyncio.create_task(recipient.run())]
    exported_at = 0.0
    try:
        async with asyncio.timeout(120):
            while not done.is_set():
                if not exported_at and donor.local_state.exported == len(groups):
                    exported_at = time.perf_counter()
                await asyncio.wait([asyncio.ensure_future(done.wait())], timeout=0.005)
        ended = time.perf_counter()
        exported_at = exported_at or ended
    finally:
        for worker in (donor, recipient):
            worker.stop(1.0)
        await asyncio.gather(*tasks)
    seconds = ended - began
    return {
        "mib": mib,
        "groups": len(groups),
        "seconds": seconds,
        "export_seconds": exported_at - began,
        "mib_per_s": mib / seconds,
        "ms_per_mib": 1000 * seconds / mib,
    }


def _key_file(path: Path) -> Path:
    lines = [
        f'[[credential]]\nid = "{key}"\nsecret = "{secrets.token_hex(16)}"\nrole = "{role}"\ntenant = "t"\n\n'
        for key, role in (
            ("admin-1", "admin"),
            ("producer-1", "producer"),
            ("worker-1", "worker"),
            ("worker-2", "worker"),
        )
    ]
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


def state_section(results: dict[str, Any], add: Any) -> None:
    """The report's state-transfer section (bench/report.py calls it; nothing when it did not run)."""
    r = results.get("state")
    if not r:
        return
    add("## State transfer: local state moving with its groups (issue 18)\n")
    add(
        measured(r)
        + f". The scenario took {r['seconds']:.0f} s. Each size is its own `strictq serve` (HTTPS, queue core"
        f" in-process, no egress proxy); {r['group_state'] // 1024} KiB of local state per group, one message"
        " waiting per group. From the admin's `handover` call to the second worker having imported every"
        " group's state and processed every message: the donor SDK worker's poll answer names the groups, it"
        " uploads their state (`PUT /queue/1/{queue}/state`, durable before the answer), the recipient gets"
        " each state inline in its poll items. *Export*: until the donor's last upload was answered. Both"
        " workers run in the benchmark's process (bench/state_bench.py).\n"
    )
    add("| state | groups | end to end | export | MiB/s | ms per MiB |\n|---|---|---|---|---|---|")
    for run in r["runs"]:
        add(
            f"| {run['mib']} MiB | {run['groups']} | {run['seconds']:.2f} s | {run['export_seconds']:.2f} s"
            f" | {run['mib_per_s']:.1f} | {run['ms_per_mib']:.0f} |"
        )
    add("")
