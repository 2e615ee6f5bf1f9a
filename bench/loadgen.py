"""The load generator: separate processes, each an asyncio loop (uvloop) with N producer and M consumer tasks.

One design drives both targets:
  * strictq: aiohttp with keep-alive connections and orjson against the internal HTTP API
    (send batch -> POST /send, receive batch -> POST /receive, ack batch -> POST /ack with the receipts);
  * redis: redis-py asyncio against Redis Streams (XADD x batch pipelined, XREADGROUP COUNT batch,
    XACK + XDEL of the batch's ids pipelined);
  * emodb, sqs: the gateway (`strictq serve`) over HTTPS, on its EmoDB face (X-BV-API-Key) or its SQS
    JSON face (SigV4, signed in the generator with botocore), with the same send/receive/ack batches.

Modes:
  * closed: every task loops as fast as its replies come back. Producers hold off while this process has
    more than `cap` messages sent but not yet acked, so the queue depth stays steady (at its start
    depth plus at most procs x cap) and the figure is the sustainable end-to-end rate, not a fill rate.
  * open: rate-limited and open-loop; requests start on a fixed schedule whether or not earlier ones have
    finished, and latency is measured from the scheduled start (no coordinated omission).

Every process starts at the same wall-clock instant (`start_at`), warms up, then counts only what
happens inside the measurement window, which is the same for all processes and for the parent's CPU
samples of the server.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

JSON = {"Content-Type": "application/json"}
MAX_OUTSTANDING = 4000  # open loop: past this many unfinished requests, count drops instead of queueing


@dataclass
class LoadSpec:
    target: str  # "strictq" | "redis"
    address: str  # base URL, or "host:port" for redis
    queue: str
    mode: str = "closed"  # "closed" | "open"
    producers: int = 4
    consumers: int = 8
    groups: int = 100
    batch: int = 10
    body_size: int = 256
    warmup: float = 2.0
    duration: float = 8.0
    cap: int = 5000
    rate: float = 0.0  # open loop: messages/s sent by this process
    receive_factor: float = 1.1  # open loop: receive(batch)+ack requests per send request
    wait: float = 1.0  # closed loop: long-poll seconds when the queue is empty
    ttl: float = 30.0
    index: int = 0  # which process this is
    connections: int = 0  # 0: one per task (closed); open loop uses 64
    stop_after_window: bool = True
    # Gateway targets ("emodb", "sqs"): the CA to trust and the credentials, {"producer": [id, secret],
    # "workers": [[id, secret], ...]}; consumer tasks take the workers round robin.
    ca: str = ""
    credentials: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadResult:
    index: int = 0
    sent: int = 0
    received: int = 0
    acked: int = 0
    send_requests: int = 0
    receive_requests: int = 0
    empty_receives: int = 0
    ack_requests: int = 0
    errors: int = 0
    dropped: int = 0
    sign_ns: int = 0  # SQS face: time spent SigV4-signing requests in the generator
    signs: int = 0
    first_errors: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0  # this generator process, inside the window
    window: float = 0.0  # measured window length (loop clock)
    send_latency: list[float] = field(default_factory=list)  # seconds
    receive_ack_latency: list[float] = field(default_factory=list)
    delivery_latency: list[float] = field(default_factory=list)  # open loop: send stamp -> received


class Stats:
    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.acked = 0
        self.send_requests = 0
        self.receive_requests = 0
        self.empty_receives = 0
        self.ack_requests = 0
        self.errors = 0
        self.dropped = 0
        self.sign_ns = 0
        self.signs = 0
        self.first_errors: list[str] = []

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(text[:300])

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


class Generator:
    """Shared state of one process's tasks."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.stats = Stats()
        self.stop = False
        self.in_window = False
        self.window_start = 0.0
        self.window_end = 0.0
        self.room = asyncio.Event()
        self.room.set()
        self.outstanding = 0
        self.send_latency: list[float] = []
        self.receive_ack_latency: list[float] = []
        self.delivery_latency: list[float] = []
        self.rng = random.Random(1000 + spec.index)
        self.pad = "x" * spec.body_size
        self.loop = asyncio.get_running_loop()
        self.tasks: list[asyncio.Task[None]] = []

    # --------------------------------------------------------------------------------- shared bits
    def body(self) -> str:
        if self.spec.mode == "open":  # a send stamp for delivery latency, padded to the body size
            stamp = f"{time.time():.6f}|"
            return stamp + self.pad[len(stamp) :]
        return self.pad

    def groups(self) -> list[str]:
        n = self.spec.groups
        return [f"g{self.rng.randrange(n)}" for _ in range(self.spec.batch)]

    def record(self, samples: list[float], started: float, value: float) -> None:
        if self.window_start <= started < self.window_end:
            samples.append(value)

    def delivered(self, bodies: list[bytes | str]) -> None:
        if self.spec.mode != "open":
            return
        now = time.time()
        for body in bodies:
            head = body[:17] if isinstance(body, str) else body[:17].decode()
            try:
                self.delivery_latency.append(now - float(head.split("|", 1)[0]))
            except ValueError:
                pass

    async def gate(self) -> None:
        """Closed loop: keep this process's sent-but-unacked messages under `cap`."""
        stats = self.stats
        while not self.stop and stats.sent - stats.acked > self.spec.cap:
            self.room.clear()
            try:
                await asyncio.wait_for(self.room.wait(), 0.5)
            except TimeoutError:
                pass

    # ------------------------------------------------------------------------------------- drivers
    async def closed_producer(self, client: Any) -> None:
        while not self.stop:
            await self.gate()
            if self.stop:
                break
            started = time.perf_counter()
            await client.send(self)
            self.record(self.send_latency, started, time.perf_counter() - started)

    async def closed_consumer(self, client: Any, worker: str) -> None:
        while not self.stop:
            started = time.perf_counter()
            got = await client.receive_ack(self, worker, self.spec.wait)
            if got:
                self.record(self.receive_ack_latency, started, time.perf_counter() - started)
                self.room.set()

    async def open_loop(self, client: Any, kind: str) -> None:
        """Start one request every `interval` on a fixed schedule; latency counts from the schedule."""
        spec = self.spec
        interval = spec.batch / spec.rate
        if kind == "receive":  # poll a little faster than messages arrive, so no backlog builds up
            interval /= spec.receive_factor
        # Spread the processes' and the two kinds' schedules so they do not fire in lock-step.
        next_at = time.perf_counter() + interval * (spec.index * 0.37 + (0.5 if kind == "receive" else 0.0))
        worker = f"w{spec.index}-open"
        while not self.stop:
            now = time.perf_counter()
            while next_at <= now and not self.stop:
                if self.outstanding >= MAX_OUTSTANDING:
                    self.stats.dropped += 1
                else:
                    self.outstanding += 1
                    coro = self._timed_send(client, next_at) if kind == "send" else None
                    if coro is None:
                        coro = self._timed_receive(client, worker, next_at)
                    task = self.loop.create_task(coro)
                    self.tasks.append(task)
                    task.add_done_callback(self._finished)
                next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.outstanding -= 1
        try:
            self.tasks.remove(task)
        except ValueError:
            pass

    async def _timed_send(self, client: Any, scheduled: float) -> None:
        await client.send(self)
        self.record(self.send_latency, scheduled, time.perf_counter() - scheduled)

    async def _timed_receive(self, client: Any, worker: str, scheduled: float) -> None:
        await client.receive_ack(self, worker, 0.0)
        self.record(self.receive_ack_latency, scheduled, time.perf_counter() - scheduled)


# ----------------------------------------------------------------------------------------- targets
class StrictqClient:
    def __init__(self, spec: LoadSpec) -> None:
        import aiohttp

        self.aiohttp = aiohttp
        self.spec = spec
        base = spec.address.rstrip("/") + f"/v1/queues/{spec.queue}"
        self.send_url = base + "/send"
        self.receive_url = base + "/receive"
        self.ack_url = base + "/ack"
        limit = spec.connections or (64 if spec.mode == "open" else spec.producers + spec.consumers)
        from bench.servers import internal_headers

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=60),
            headers=internal_headers(),  # the queue server's internal secret, on every request
        )

    async def close(self) -> None:
        await self.session.close()

    async def _post(self, gen: Generator, url: str, payload: bytes) -> Any:
        import orjson

        try:
            async with self.session.post(url, data=payload, headers=JSON) as response:
                raw = await response.read()
                if response.status != 200:
                    gen.stats.error(f"{response.status} {raw[:200]!r}")
                    return None
                return orjson.loads(raw)
        except (self.aiohttp.ClientError, TimeoutError) as exc:
            if not gen.stop:
                gen.stats.error(f"{type(exc).__name__}: {exc}")
            return None

    async def send(self, gen: Generator) -> None:
        import orjson

        body = gen.body()
        messages = [{"body": body, "group": group} for group in gen.groups()]
        gen.stats.sent += len(messages)  # counted when issued, so the gate sees it at once
        data = await self._post(gen, self.send_url, orjson.dumps({"messages": messages, "create": True}))
        gen.stats.send_requests += 1
        if data is None:
            gen.stats.sent -= len(messages)
            return
        bad = sum(1 for r in data["results"] if "error" in r)
        if bad:
            gen.stats.sent -= bad
            gen.stats.error(f"send: {bad} entries refused")

    async def receive_ack(self, gen: Generator, worker: str, wait: float) -> int:
        import orjson

        spec = self.spec
        payload = {"limit": spec.batch, "ttl": spec.ttl, "worker": worker}
        if wait:
            payload["wait"] = wait
        data = await self._post(gen, self.receive_url, orjson.dumps(payload))
        gen.stats.receive_requests += 1
        if data is None:
            return 0
        messages = data["messages"]
        if not messages:
            gen.stats.empty_receives += 1
            return 0
        gen.stats.received += len(messages)
        gen.delivered([m.get("body", "") for m in messages])
        receipts = [m["receipt"] for m in messages]
        data = await self._post(gen, self.ack_url, orjson.dumps({"receipts": receipts}))
        gen.stats.ack_requests += 1
        if data is None:
            return 0
        ok = sum(1 for r in data["results"] if r["status"] == "ok")
        if ok != len(receipts):
            gen.stats.error(f"ack: {len(receipts) - ok} of {len(receipts)} not ok: {data['results'][:2]}")
        gen.stats.acked += ok
        return ok


class RedisStreamsClient:
    GROUP = "bench"

    def __init__(self, spec: LoadSpec) -> None:
        import redis.asyncio as redis

        host, port = spec.address.rsplit(":", 1)
        self.spec = spec
        self.stream = spec.queue
        limit = spec.connections or (64 if spec.mode == "open" else spec.producers + spec.consumers)
        self.redis = redis.Redis(host=host, port=int(port), max_connections=limit + 4)
        self.errors = (redis.RedisError, OSError, TimeoutError)

    async def close(self) -> None:
        await self.redis.aclose()

    async def send(self, gen: Generator) -> None:
        body = gen.body()
        groups = gen.groups()
        gen.stats.sent += len(groups)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for group in groups:
                    pipe.xadd(self.stream, {"g": group, "b": body})
                await pipe.execute()
        except self.errors as exc:
            gen.stats.sent -= len(groups)
            if not gen.stop:
                gen.stats.error(f"xadd: {exc!r}")
        gen.stats.send_requests += 1

    async def receive_ack(self, gen: Generator, worker: str, wait: float) -> int:
        block = int(wait * 1000) if wait else None
        try:
            reply = await self.redis.xreadgroup(
                self.GROUP, worker, {self.stream: ">"}, count=self.spec.batch, block=block
            )
        except self.errors as exc:
            if not gen.stop:
                gen.stats.error(f"xreadgroup: {exc!r}")
            return 0
        gen.stats.receive_requests += 1
        entries = reply[0][1] if reply else []
        if not entries:
            gen.stats.empty_receives += 1
            return 0
        gen.stats.received += len(entries)
        gen.delivered([fields[b"b"] for _, fields in entries])
        ids = [entry_id for entry_id, _ in entries]
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xack(self.stream, self.GROUP, *ids)
                pipe.xdel(self.stream, *ids)
                acked, _ = await pipe.execute()
        except self.errors as exc:
            if not gen.stop:
                gen.stats.error(f"xack: {exc!r}")
            return 0
        gen.stats.ack_requests += 1
        if acked != len(ids):
            gen.stats.error(f"xack: {len(ids) - acked} of {len(ids)} not acked")
        gen.stats.acked += acked
        return int(acked)


class GatewayClient:
    """Shared by the gateway's faces: keep-alive aiohttp connections over HTTPS, trusting the gateway's CA
    (the `strictq: ca` file), the producer credential for sends and the workers' round robin for claims."""

    def __init__(self, spec: LoadSpec) -> None:
        import ssl

        import aiohttp

        self.aiohttp = aiohttp
        self.spec = spec
        self.base = spec.address.rstrip("/")
        context = ssl.create_default_context(cafile=spec.ca or None)
        limit = spec.connections or (64 if spec.mode == "open" else spec.producers + spec.consumers)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60, ssl=context),
            timeout=aiohttp.ClientTimeout(total=60),
        )
        self.producer: tuple[str, str] = tuple(spec.credentials["producer"])  # type: ignore[assignment]
        self.workers: list[tuple[str, str]] = [tuple(w) for w in spec.credentials["workers"]]  # type: ignore[misc]
        self.worker_of: dict[str, tuple[str, str]] = {}

    def worker(self, name: str) -> tuple[str, str]:
        """(id, secret) of the worker credential a consumer task uses: worker-1..n round robin."""
        got = self.worker_of.get(name)
        if got is None:
            got = self.workers[(self.spec.index + len(self.worker_of)) % len(self.workers)]
            self.worker_of[name] = got
        return got

    def group(self, gen: Generator) -> str:
        return f"g{gen.rng.randrange(self.spec.groups)}"

    async def close(self) -> None:
        await self.session.close()

    async def _request(
        self, gen: Generator, method: str, url: str, data: bytes | None, headers: dict[str, str]
    ) -> bytes | None:
        try:
            async with self.session.request(method, url, data=data, headers=headers) as response:
                raw = await response.read()
                if response.status != 200:
                    gen.stats.error(f"{method} {url.rsplit('/', 2)[-1]}: {response.status} {raw[:200]!r}")
                    return None
                return raw
        except (self.aiohttp.ClientError, TimeoutError, OSError) as exc:
            if not gen.stop:
                gen.stats.error(f"{type(exc).__name__}: {exc}")
            return None


EMPTY_POLL_PAUSE = 0.02  # polls skip the face's `wait` long poll: an empty poll waits this long


class EmoDbClient(GatewayClient):
    """The EmoDB face: `_sendbatch` of `batch` messages in one random group (`?group=`), poll(limit=batch),
    then ack of the polled ids with their lease token (`X-Strictq-Lease`; one ack request per token,
    normally one: a poll claims one group's prefix)."""

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        self.send_url = f"{self.base}/queue/1/_sendbatch"
        self.poll_url = f"{self.base}/queue/1/{spec.queue}/poll?ttl={spec.ttl:g}&limit={spec.batch}"
        self.ack_url = f"{self.base}/queue/1/{spec.queue}/ack"
        self.send_headers = {**JSON, "X-BV-API-Key": self.producer[1]}

    async def send(self, gen: Generator) -> None:
        import orjson

        n = self.spec.batch
        payload = orjson.dumps({self.spec.queue: [gen.body() for _ in range(n)]})
        gen.stats.sent += n
        raw = await self._request(
            gen, "POST", f"{self.send_url}?group={self.group(gen)}", payload, self.send_headers
        )
        gen.stats.send_requests += 1
        if raw is None:
            gen.stats.sent -= n

    async def receive_ack(self, gen: Generator, worker: str, wait: float) -> int:
        import orjson

        secret = self.worker(worker)[1]
        raw = await self._request(gen, "GET", self.poll_url, None, {"X-BV-API-Key": secret})
        gen.stats.receive_requests += 1
        if raw is None:
            return 0
        messages = orjson.loads(raw)
        if not messages:
            gen.stats.empty_receives += 1
            if wait:
                await asyncio.sleep(EMPTY_POLL_PAUSE)
            return 0
        gen.stats.received += len(messages)
        gen.delivered([m["payload"] for m in messages])
        by_token: dict[int, list[str]] = {}
        for m in messages:
            by_token.setdefault(m["token"], []).append(m["id"])
        acked = 0
        for token, ids in by_token.items():
            headers = {**JSON, "X-BV-API-Key": secret, "X-Strictq-Lease": str(token)}
            raw = await self._request(gen, "POST", self.ack_url, orjson.dumps(ids), headers)
            gen.stats.ack_requests += 1
            if raw is not None:
                acked += len(ids)
        gen.stats.acked += acked
        return acked


class SqsClient(GatewayClient):
    """The SQS JSON face, SigV4-signed here with botocore's SigV4Auth (timed: `sign_ns`): SendMessageBatch of
    `batch` entries in one random MessageGroupId, ReceiveMessage(batch), DeleteMessageBatch of what came.
    Bodies carry the process id and a counter: the FIFO queue deduplicates by content (5 minutes)."""

    AMZ_JSON = "application/x-amz-json-1.0"

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        self.AWSRequest = AWSRequest
        self.endpoint = self.base + "/"
        self.queue_url = f"{self.base}/{spec.credentials['tenant']}/{spec.queue}"
        region = spec.credentials.get("region", "us-east-1")
        self.signers = {
            key: SigV4Auth(Credentials(key, secret), "sqs", region)
            for key, secret in [self.producer, *self.workers]
        }
        self.counter = 0

    def unique(self, body: str) -> str:
        self.counter += 1
        tag = f"{os.getpid()}.{self.counter}."  # unique across repeats on the same server too
        head, bar, rest = body.partition("|")
        if bar:  # open loop: keep the send stamp in front
            return head + bar + tag + rest[len(tag) :]
        return tag + body[len(tag) :]

    def signed(self, gen: Generator, key: str, action: str, payload: bytes) -> dict[str, str]:
        started = time.perf_counter_ns()
        request = self.AWSRequest(
            method="POST",
            url=self.endpoint,
            data=payload,
            headers={"Content-Type": self.AMZ_JSON, "X-Amz-Target": "AmazonSQS." + action},
        )
        self.signers[key].add_auth(request)
        headers = dict(request.headers.items())
        gen.stats.sign_ns += time.perf_counter_ns() - started
        gen.stats.signs += 1
        return headers

    async def call(self, gen: Generator, key: str, action: str, params: dict[str, Any]) -> Any:
        import orjson

        payload = orjson.dumps(params)
        raw = await self._request(gen, "POST", self.endpoint, payload, self.signed(gen, key, action, payload))
        return None if raw is None else orjson.loads(raw)

    async def send(self, gen: Generator) -> None:
        group = self.group(gen)
        entries = [
            {"Id": str(i), "MessageBody": self.unique(gen.body()), "MessageGroupId": group}
            for i in range(self.spec.batch)
        ]
        gen.stats.sent += len(entries)
        data = await self.call(
            gen, self.producer[0], "SendMessageBatch", {"QueueUrl": self.queue_url, "Entries": entries}
        )
        gen.stats.send_requests += 1
        if data is None:
            gen.stats.sent -= len(entries)
            return
        failed = data.get("Failed") or []
        if failed:
            gen.stats.sent -= len(failed)
            gen.stats.error(f"send: {len(failed)} entries failed: {failed[:1]}")

    async def receive_ack(self, gen: Generator, worker: str, wait: float) -> int:
        spec = self.spec
        key = self.worker(worker)[0]
        params = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": spec.batch,
            "VisibilityTimeout": int(spec.ttl),
            "WaitTimeSeconds": int(wait),
        }
        data = await self.call(gen, key, "ReceiveMessage", params)
        gen.stats.receive_requests += 1
        if data is None:
            return 0
        messages = data.get("Messages") or []
        if not messages:
            gen.stats.empty_receives += 1
            return 0
        gen.stats.received += len(messages)
        gen.delivered([m["Body"] for m in messages])
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        data = await self.call(
            gen, key, "DeleteMessageBatch", {"QueueUrl": self.queue_url, "Entries": entries}
        )
        gen.stats.ack_requests += 1
        if data is None:
            return 0
        ok = len(data.get("Successful") or [])
        if ok != len(entries):
            gen.stats.error(
                f"delete: {len(entries) - ok} of {len(entries)} failed: {data.get('Failed', [])[:1]}"
            )
        gen.stats.acked += ok
        return ok


CLIENTS: dict[str, Any] = {
    "strictq": StrictqClient,
    "redis": RedisStreamsClient,
    "emodb": EmoDbClient,
    "sqs": SqsClient,
}


# ---------------------------------------------------------------------------------------- process
async def _main(spec: LoadSpec, start_at: float) -> LoadResult:
    loop = asyncio.get_running_loop()
    gen = Generator(spec)
    client: Any = CLIENTS[spec.target](spec)
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds: too coarse for latency
    t0 = clock() + (start_at - time.time())
    gen.window_start = t0 + spec.warmup
    gen.window_end = gen.window_start + spec.duration
    await asyncio.sleep(max(0.0, t0 - clock()))
    tasks: list[asyncio.Task[None]] = []
    if spec.mode == "open":
        if spec.producers:
            tasks.append(loop.create_task(gen.open_loop(client, "send")))
        if spec.consumers:
            tasks.append(loop.create_task(gen.open_loop(client, "receive")))
    else:
        tasks += [loop.create_task(gen.closed_producer(client)) for _ in range(spec.producers)]
        tasks += [
            loop.create_task(gen.closed_consumer(client, f"w{spec.index}-{i}")) for i in range(spec.consumers)
        ]
    await asyncio.sleep(max(0.0, gen.window_start - clock()))
    before, cpu_before, at_before = gen.stats.counts(), time.process_time(), clock()
    await asyncio.sleep(max(0.0, gen.window_end - clock()))
    after, cpu_after, at_after = gen.stats.counts(), time.process_time(), clock()
    gen.stop = True
    gen.room.set()
    # Let in-flight requests finish briefly (long polls end within `wait`), then cancel the rest.
    _done, pending = await asyncio.wait(tasks + list(gen.tasks), timeout=spec.wait + 2.0)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await client.close()
    delta = {k: after[k] - before[k] for k in after}
    return LoadResult(
        index=spec.index,
        first_errors=gen.stats.first_errors,
        cpu_seconds=cpu_after - cpu_before,
        window=at_after - at_before,
        send_latency=gen.send_latency,
        receive_ack_latency=gen.receive_ack_latency,
        delivery_latency=gen.delivery_latency,
        **delta,
    )


def worker_entry(spec_dict: dict[str, Any], conn: Connection) -> None:
    """Process entry point: report ready, wait for the common start instant, run, send the result."""
    spec = LoadSpec(**spec_dict)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    conn.send(("ready", os.getpid()))
    start_at = conn.recv()
    if start_at is None:
        return
    try:
        result = runner(_main(spec, start_at))
        conn.send(("ok", asdict(result)))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()
