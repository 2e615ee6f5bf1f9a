"""The pipelining benchmark (issue 18): throughput of a workload with pre-processing, with and without
pipelining, in the same run.

One `strictq serve` (HTTPS, the queue core in-process, no egress proxy). Per run, a fresh queue gets
MESSAGES messages spread over GROUPS groups (the SDK's Producer), then one SDK worker drains it with one
processing slot (concurrency 1): each message takes PREPROCESS s of pre-processing (an await: fetching
inputs) and PROCESS s of processing (an await too). *Pipelined*: `Worker(preprocess=...)`, the next
message of another group claimed ahead and pre-processed while the current one is processed, scheduled by
the queue's estimates (set through the admin route, as an operator would); *sequential*:
`Worker(preprocess=..., pipeline=False)`, pre-processing in the slot before the handler. Figures: messages
acknowledged per second from the first delivery to the last ack, the ratio, and the ideal ratio
(PREPROCESS + PROCESS) / PROCESS. Runs alternate, the median of each kept (the machine is shared).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from strictq.sdk import ClientConfig, Entry, Message, Producer, Worker

from .scenarios import Progress, Settings, measured, provenance
from .servers import GatewayServer

PREPROCESS = 0.020
PROCESS = 0.030
GROUPS = 50


def run_pipeline_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    messages = 100 if st.quick else 300
    repeats = 1 if st.quick else 3
    work = st.work_dir / "pipeline"
    work.mkdir(parents=True, exist_ok=True)
    server = GatewayServer(work / "data", st.out_dir / "pipeline.log", extra_args=["--no-proxy"])
    server.start()
    runs: dict[str, list[float]] = {"pipelined": [], "sequential": []}
    try:
        keys = server.credentials()
        for repeat in range(repeats):
            for mode in ("pipelined", "sequential"):
                rate = asyncio.run(
                    _drain(server, keys, f"pipe-{mode}-{repeat}", mode == "pipelined", messages)
                )
                runs[mode].append(rate)
                progress(f"pipeline: {mode} run {repeat + 1}: {rate:.1f} msg/s")
    finally:
        server.stop()
    result: dict[str, Any] = {
        "messages": messages,
        "groups": GROUPS,
        "preprocess_ms": PREPROCESS * 1000,
        "process_ms": PROCESS * 1000,
        "runs": runs,
        **{mode: statistics.median(rates) for mode, rates in runs.items()},
    }
    result["ratio"] = result["pipelined"] / result["sequential"]
    result["ideal_ratio"] = (PREPROCESS + PROCESS) / PROCESS
    result.update(provenance(st, started))
    return result


def _config(server: GatewayServer, keys: dict[str, dict[str, str]], role: str) -> ClientConfig:
    key_id = next(k for k, v in keys.items() if v["role"] == role)
    secret = keys[key_id]["secret"]
    return ClientConfig(
        url=server.url, ca_file=server.ca or None, api_key=secret, worker_id=key_id, worker_secret=secret
    )


async def _drain(
    server: GatewayServer, keys: dict[str, dict[str, str]], queue: str, pipelined: bool, messages: int
) -> float:
    """Fill `queue`, then time one worker draining it: acknowledged messages per second."""
    async with Producer(_config(server, keys, "producer")) as producer:
        entries = [Entry(queue, {"n": i}, f"g{i % GROUPS}") for i in range(messages)]
        results = await producer.send_batch(entries)
        if not all(r.ok for r in results):
            raise RuntimeError(f"pipeline: {sum(not r.ok for r in results)} sends failed")
    await _set_estimates(server, keys, queue)
    first: list[float] = []

    async def prepare(msg: Message) -> int:
        await asyncio.sleep(PREPROCESS)
        return int(msg.payload["n"])

    async def handle(msg: Message) -> None:
        if not first:
            first.append(time.perf_counter())
        await asyncio.sleep(PROCESS)

    worker = Worker(
        queue,
        handle,
        config=_config(server, keys, "worker"),
        concurrency=1,
        preprocess=prepare,
        pipeline=pipelined,
    )
    task = asyncio.create_task(worker.run())
    deadline = time.perf_counter() + 120
    while worker.stats.acked < messages and time.perf_counter() < deadline and not task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # the SDK's stats are polled, as its tests do
    ended = time.perf_counter()
    worker.stop(1.0)
    await task
    if worker.stats.acked < messages:
        raise RuntimeError(f"pipeline: only {worker.stats.acked} of {messages} acknowledged")
    return (messages - 1) / (ended - first[0])


async def _set_estimates(server: GatewayServer, keys: dict[str, dict[str, str]], queue: str) -> None:
    """The queue's estimates through the admin route (what `strictq estimates` does)."""
    import ssl

    import aiohttp

    admin = next(v["secret"] for v in keys.values() if v["role"] == "admin")
    context = ssl.create_default_context(cafile=server.ca) if server.ca else None
    body = {"processing_estimate": PROCESS, "preprocessing_estimate": PREPROCESS}
    async with (
        aiohttp.ClientSession() as http,
        http.put(
            f"{server.url}/admin/v1/queues/{queue}/estimates",
            json=body,
            headers={"X-BV-API-Key": admin},
            ssl=context if context is not None else False,
        ) as answer,
    ):
        if answer.status != 200:
            raise RuntimeError(f"pipeline: PUT estimates: {answer.status} {await answer.text()}")


def pipeline_section(results: dict[str, Any], add: Any) -> None:
    """The report's pipelining section (bench/report.py calls it; nothing when it did not run)."""
    r = results.get("pipeline")
    if not r:
        return
    add("## Pipelining: pre-processing the next group while one is processed (issue 18)\n")
    add(
        measured(r)
        + f". The scenario took {r['seconds']:.0f} s. One `strictq serve` (HTTPS, queue core in-process,"
        f" no egress proxy); per run a fresh queue of {r['messages']} messages over {r['groups']} groups,"
        f" drained by one SDK worker with one processing slot: {r['preprocess_ms']:g} ms of pre-processing"
        " and"
        f" {r['process_ms']:g} ms of processing per message (awaits, as fetching inputs and calling a backend"
        " are). *Pipelined*: `Worker(preprocess=...)` claims the next group ahead and pre-processes it while"
        " the current one is processed, scheduled by the queue's estimates; *sequential*:"
        " `Worker(preprocess=..., pipeline=False)`. Messages acknowledged per second from the first"
        " delivery to the last ack; runs alternate, the median of each (bench/pipeline_bench.py).\n"
    )
    add("| worker | msg/s (median) | runs |\n|---|---|---|")
    for mode in ("pipelined", "sequential"):
        add(f"| {mode} | {r[mode]:.1f} | {', '.join(f'{x:.1f}' for x in r['runs'][mode])} |")
    add(
        f"\nRatio pipelined / sequential: **{r['ratio']:.2f}x**. Hiding the pre-processing alone would give"
        f" {r['ideal_ratio']:.2f}x; the pipeline also hides the round trips (the next message is already"
        " claimed when a slot frees, and its handler starts while the previous result is reported), which"
        " the sequential worker pays per message, so the ratio can exceed that.\n"
    )
