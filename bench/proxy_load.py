"""`python -m bench.proxy_load ...`: closed-loop HTTP load, direct or through one or more proxies.

`--concurrency` tasks each send one request at a time for `--warmup` + `--duration` seconds; only the
measured window counts. With several `--proxy` URLs (our proxy's `--processes N`) task i uses proxy
i mod N, as the SDK spreads workers over the proxy processes. `--tagged` adds the worker SDK's tags
(`X-Strictq-*`, a call ordinal per request, five calls per "message"), so the capture, tagging and lease
guard addons do their real work. Prints one JSON line: requests, errors, rate, p50/p99 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import time

import aiohttp
import orjson

from .procstat import cpu_seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_load")
    parser.add_argument("--target", required=True, help="backend URL (http:// or https://)")
    parser.add_argument("--proxy", action="append", default=[], help="proxy URL (repeatable)")
    parser.add_argument("--ca", action="append", default=[], help="CA file to trust (repeatable)")
    parser.add_argument("--auth", help="worker-id:secret for Proxy-Authorization")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--tagged", action="store_true")
    parser.add_argument(
        "--watch-pid",
        type=int,
        action="append",
        default=[],
        help="a proxy process whose CPU time over the measured window is reported (repeatable)",
    )
    return parser.parse_args()


async def run(args: argparse.Namespace) -> dict[str, object]:
    context = ssl.create_default_context()
    for ca in args.ca:
        context.load_verify_locations(ca)
    auth = None
    if args.auth:
        user, _, secret = args.auth.partition(":")
        auth = aiohttp.BasicAuth(user, secret)
    connector = aiohttp.TCPConnector(ssl=context, limit=0, force_close=False)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + args.warmup
    stop_at = measure_from + args.duration
    cpu: dict[str, float] = {}

    async def watch() -> None:
        """The watched processes' CPU seconds from the start to the end of the measured window: CPU per
        request without the warm-up's connection set-up (TLS handshakes)."""
        await asyncio.sleep(max(0.0, measure_from - loop.time()))
        cpu["start"] = sum(cpu_seconds(pid) for pid in args.watch_pid)
        await asyncio.sleep(max(0.0, stop_at - loop.time()))
        cpu["end"] = sum(cpu_seconds(pid) for pid in args.watch_pid)

    async def worker(index: int, session: aiohttp.ClientSession) -> None:
        proxy = args.proxy[index % len(args.proxy)] if args.proxy else None
        n = 0
        while True:
            now = loop.time()
            if now >= stop_at:
                return
            headers = {}
            if args.tagged:
                headers = {
                    "X-Strictq-Queue": "bench",
                    "X-Strictq-Message-Id": f"m-{index}-{n // 5}",
                    "X-Strictq-Group": f"g-{index}",
                    "X-Strictq-Lease": "4294967297",
                    "X-Strictq-Attempt": "1",
                    "X-Strictq-Call": str(n % 5 + 1),
                }
            n += 1
            began = time.perf_counter()
            try:
                async with session.get(
                    args.target + f"/items/{index}?page={n % 7}",
                    headers=headers,
                    proxy=proxy,
                    proxy_auth=auth,
                ) as response:
                    await response.read()
                    ok = response.status == 200
                    reason = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                ok, reason = False, type(exc).__name__
            elapsed = time.perf_counter() - began
            if loop.time() >= measure_from and loop.time() < stop_at:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors[reason] = errors.get(reason, 0) + 1

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(args.concurrency):
                group.create_task(worker(i, session), name=f"proxy-load-{i}")
            if args.watch_pid:
                group.create_task(watch(), name="proxy-load-cpu")
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    proxy_cpu = cpu["end"] - cpu["start"] if "end" in cpu else None
    return {
        "proxy_cpu_s": proxy_cpu,
        "proxy_cpu_us_per_request": 1e6 * proxy_cpu / len(latencies) if proxy_cpu and latencies else None,
        "requests": len(latencies),
        "errors": errors,
        "rate": len(latencies) / args.duration,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }


if __name__ == "__main__":
    import uvloop

    print(orjson.dumps(uvloop.run(run(parse_args()))).decode(), flush=True)
