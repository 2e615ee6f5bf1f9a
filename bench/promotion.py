"""`python -m bench.promotion [--messages N]`: what a promotion costs with N queued messages (issue 28).

A cold standby (one that applies nothing until promoted) must fetch the partition's snapshot from the
object store, put it in place and open it as a QueueService (the core's restore) before even applying the
stream's tail; a warm one only opens its own store. This fills a partition store with N messages (256-byte
bodies, 1,000 groups), uploads its copy to a JetStream object store (one nats-server of its own), then
times download, install and open three times, and the warm open once. Everything it starts it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from pathlib import Path

from cluster.layout import ClusterLayout, ensure_streams
from cluster.snapshots import SnapshotBucket, copy_store, install
from queue_core.machine import SendRequest
from queue_core.service import QueueService

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from cluster_support import nats_client, running_nats  # noqa: E402  (the tests' JetStream helpers)

BATCH = 100
GROUPS = 1_000


async def opened(data_dir: Path) -> float:
    """Seconds to open a store as a QueueService (then closed)."""
    started = time.perf_counter()
    service = QueueService(data_dir)
    await service.start()
    seconds = time.perf_counter() - started
    await service.close()
    return seconds


async def measure(work: Path, messages: int) -> None:
    source = work / "source"
    service = QueueService(source)
    await service.start()
    started = time.perf_counter()
    for i in range(messages // BATCH):
        batch = [SendRequest(b"x" * 256, group=f"g{(i * BATCH + j) % GROUPS}") for j in range(BATCH)]
        await service.send("orders", batch, create=True)
    await service.close()
    size = (source / "queue.sqlite3").stat().st_size
    filled = time.perf_counter() - started
    print(f"filled {messages:,} in {filled:.1f}s; store {size / 1e6:.1f} MB", flush=True)
    with running_nats(work / "nats", 1) as nats:
        async with nats_client(nats, "bench-promotion") as nc:
            js = nc.jetstream()
            layout = ClusterLayout(secrets.token_hex(4), 1, 1)
            await ensure_streams(js, layout)
            bucket = SnapshotBucket(js, layout)
            copy = work / "copy.sqlite3"
            await asyncio.to_thread(copy_store, source / "queue.sqlite3", copy)
            started = time.perf_counter()
            await bucket.upload(0, copy, 1, 1)
            print(f"upload {time.perf_counter() - started:.2f}s", flush=True)
            for attempt in range(3):
                target = work / f"cold{attempt}" / "p0"
                target.mkdir(parents=True)
                t0 = time.perf_counter()
                await bucket.download(0, target / "snapshot-in.sqlite3")
                t1 = time.perf_counter()
                await asyncio.to_thread(install, target / "snapshot-in.sqlite3", target / "queue.sqlite3")
                t2 = time.perf_counter()
                restore = await opened(target)
                print(
                    f"cold: download {t1 - t0:.2f}s, install {t2 - t1:.2f}s, open {restore:.2f}s,"
                    f" total {t2 - t0 + restore:.2f}s (before the stream's tail)",
                    flush=True,
                )
    print(f"warm: open {await opened(source):.2f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.promotion", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="strictq-promotion-") as work:
        asyncio.run(measure(Path(work), args.messages))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
