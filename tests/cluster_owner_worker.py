"""A partition owner in a process of its own, for tests/test_cluster_replication.py's SIGKILL test.

A real `cluster.node.ClusterNode` on a one-partition layout (`--layout`, made by the test) takes the
partition and sends one message at a time to it, printing `acked <n> <message id>` on stdout once each send
is acknowledged (on a quorum of the stream, committed in its store without an fsync: cluster.replicated_log),
until the test SIGKILLs it. Bounded: it stops by itself after --sends sends or --seconds seconds. The NATS
password comes in STRICTQ_TEST_NATS_PASSWORD (not argv, which other users can read).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from cluster.connect import connect
from cluster.layout import ClusterLayout
from cluster.node import ClusterNode
from queue_core.machine import SendRequest, SendResult

QUEUE = "orders"
GROUP = "g"


async def run(args: argparse.Namespace) -> int:
    nc = await connect(
        args.urls.split(","), args.user, os.environ["STRICTQ_TEST_NATS_PASSWORD"], name=args.name
    )
    node = ClusterNode(args.name, Path(args.data_dir), nc, ClusterLayout(args.layout, 1, 3), url="http://x")
    deadline = time.monotonic() + args.seconds
    try:
        await node.start()
        while (service := node.slots[0].service) is None or not service.healthy:
            if time.monotonic() > deadline:
                print("never served", flush=True)
                return 1
            await asyncio.sleep(0.05)
        print("serving", flush=True)
        for n in range(args.sends):
            if time.monotonic() > deadline:
                break
            results = await service.send(QUEUE, [SendRequest(f"m{n}".encode(), group=GROUP)], create=True)
            result = results[0]
            assert isinstance(result, SendResult), result
            print(f"acked {n} {result.message_id}", flush=True)
    finally:
        await node.close()
        await nc.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--layout", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--sends", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
