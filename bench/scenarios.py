"""The scenarios: each starts what it needs, measures, stops everything it started, returns plain data."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .core_bench import run_core
from .harness import LoadSummary, run_load
from .loadgen import LoadSpec
from .preload import preload
from .profiling import RATE, analyze_pyspy, pyspy_binary, render_pyspy, start_pyspy
from .proxy_scenario import scenario_proxy
from .servers import GatewayServer, QueueServer, RedisServer, internal_headers

QUEUE = "bench"
SQS_QUEUE = "bench.fifo"
Progress = Callable[[str], None]


@dataclass
class Settings:
    quick: bool
    duration: float
    warmup: float
    backlog: int
    core_messages: int
    procs: int
    producers: int
    consumers: int
    cap: int
    work_dir: Path
    out_dir: Path
    profile: bool
    repeat: int = 1
    peak: float | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def spec(self, target: str, address: str, **changes: Any) -> LoadSpec:
        base = LoadSpec(
            target=target,
            address=address,
            queue=QUEUE,
            producers=self.producers,
            consumers=self.consumers,
            groups=100,
            batch=10,
            body_size=256,
            warmup=self.warmup,
            duration=self.duration,
            cap=self.cap,
        )
        return replace(base, **changes)


def measured(r: dict[str, Any]) -> str:
    """The opening of a section from `provenance`'s fields: when, where, which code, which command."""
    m = r["machine"]
    return (
        f"Measured {m['date']} on {m['cpu']} x {m['nproc']} ({m['memory']}, Python {m['python']}), code"
        f" {m['code']}, with `{r['command']}`" + (" (**quick sizes: indicative only**)" if r["quick"] else "")
    )


def provenance(st: Settings, started: float) -> dict[str, Any]:
    """Where a scenario's figures come from (its report section prints them: `--splice` may put it
    beside older sections): quick or not, its duration, the machine, the code and the command line."""
    import shlex

    from .procstat import machine_facts
    from .run import code_version  # at run time: bench.run imports the scenarios

    machine = machine_facts()
    machine["code"] = code_version()
    return {
        "quick": st.quick,
        "seconds": time.perf_counter() - started,
        "machine": machine,
        "command": " ".join(["python -m bench.run", *(shlex.quote(a) for a in sys.argv[1:])]),
    }


def _measure(st: Settings, spec: LoadSpec, pid: int, progress: Progress, label: str) -> LoadSummary:
    """`repeat` closed-loop runs back to back on the same server; the median by end-to-end rate is kept
    (the machine is shared, so one run can be hit by unrelated load), with every run's rate recorded."""
    runs: list[LoadSummary] = []
    for i in range(st.repeat):
        runs.append(run_load(spec, st.procs, pid))
        if st.repeat > 1:
            progress(
                f"    {label} run {i + 1}/{st.repeat}: {runs[-1].ack_rate:,.0f} msg/s"
                f" (server {runs[-1].server_cores:.2f} cores, {runs[-1].server_us_per_message():.0f} us/msg;"
                f" other load {runs[-1].other_cores:.2f} cores)"
            )
    ordered = sorted(runs, key=lambda s: s.ack_rate)
    median = ordered[(len(ordered) - 1) // 2]
    median.runs = [(s.ack_rate, s.other_cores, s.server_us_per_message()) for s in runs]
    return median


def _put_queue(url: str, name: str = QUEUE) -> None:
    headers = {"Content-Type": "application/json", **internal_headers()}
    request = urllib.request.Request(f"{url}/v1/queues/{name}", data=b"{}", method="PUT", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def _internal_get(url: str) -> urllib.request.Request:
    """A GET of the queue server's internal API, with the run's internal secret."""
    return urllib.request.Request(url, headers=internal_headers())


def _queue_size(url: str, name: str = QUEUE) -> int:
    with urllib.request.urlopen(_internal_get(f"{url}/v1/queues/{name}/size"), timeout=30) as response:
        import orjson

        return int(orjson.loads(response.read())["size"])


def _metric(url: str, name: str, queue: str = QUEUE) -> int:
    """A counter from `GET /v1/queues/{q}` (metrics: sent, received, deleted, ...)."""
    import orjson

    with urllib.request.urlopen(_internal_get(f"{url}/v1/queues/{queue}"), timeout=30) as response:
        return int(orjson.loads(response.read())["metrics"][name])


def _idle_rss(server: QueueServer, settle: float = 1.0) -> int:
    """RSS once it stops moving (start-up allocations done), read from /proc/PID/status."""
    time.sleep(settle)
    last = server.rss()
    for _ in range(20):
        time.sleep(0.25)
        now = server.rss()
        if abs(now - last) < 64 * 1024:
            return now
        last = now
    return last


def _load_line(label: str, s: LoadSummary) -> str:
    return (
        f"  {label}: {s.ack_rate:,.0f} msg/s end-to-end (sent {s.send_rate:,.0f}/s, received"
        f" {s.receive_rate:,.0f}/s); server {100 * s.server_cores:.0f}% CPU"
        f" (loop {100 * s.server_main_cpu / s.duration:.0f}%,"
        f" writer {100 * s.server_other_cpu / s.duration:.0f}%),"
        f" {s.server_us_per_message():.1f} us/msg; generators {100 * s.generator_cores:.0f}%;"
        f" errors {s.errors}"
    )


def _summary(s: LoadSummary, **extra: Any) -> dict[str, Any]:
    out = s.brief()
    out.update(extra)
    return out


# ---------------------------------------------------------------------------------------------- core
def scenario_core(st: Settings, progress: Progress) -> None:
    progress(f"core: in-process QueueCore, {st.core_messages:,} messages per figure, 100 groups")
    figures = run_core(st.core_messages, 100, progress)
    st.results["core"] = [
        {
            "name": f.name,
            "batch": f.batch,
            "groups": f.groups,
            "messages": f.messages,
            "seconds": f.seconds,
            "rate": f.rate,
            "us_per_message": f.us_per_message,
        }
        for f in figures
    ]


# ----------------------------------------------------------------------------------------------- e2e
def _e2e(st: Settings, progress: Progress, key: str, groups: int) -> None:
    progress(
        f"{key}: queue server (durable), send/receive/ack batch 10, {groups:,} groups, {st.procs} generator"
        f" processes x ({st.producers} producers + {st.consumers} consumers), {st.warmup:g}s warm-up +"
        f" {st.duration:g}s"
    )
    server = QueueServer(st.work_dir / key / "data", st.out_dir / f"{key}.server.log")
    try:
        server.start()
        rss_empty = _idle_rss(server, 0.5)
        _put_queue(server.url)
        summary = _measure(st, st.spec("strictq", server.url, groups=groups), server.pid, progress, key)
        left = _queue_size(server.url)
        rss_after = _idle_rss(server, 0.5)
        processed = _metric(server.url, "deleted")
    finally:
        server.stop()
    progress(_load_line(key, summary))
    grown = (rss_after - rss_empty) / processed if processed else float("nan")
    progress(
        f"  RSS {rss_empty / 2**20:,.0f} MiB before, {rss_after / 2**20:,.0f} MiB after"
        f" {processed:,} messages went through ({left:,} still queued):"
        f" {grown:,.0f} bytes per message processed"
    )
    st.results[key] = _summary(
        summary, groups=groups, rss_empty=rss_empty, rss_after=rss_after, processed=processed, queue_left=left
    )


def scenario_e2e_100(st: Settings, progress: Progress) -> None:
    _e2e(st, progress, "e2e-100", 100)


def scenario_e2e_10k(st: Settings, progress: Progress) -> None:
    _e2e(st, progress, "e2e-10k", 10_000)


# ------------------------------------------------------------------------------------------- latency
def scenario_latency(st: Settings, progress: Progress) -> None:
    peak = st.peak or (st.results.get("e2e-100") or {}).get("ack_rate")
    if not peak:
        progress("latency: no peak measured in this run; measuring e2e-100 first")
        scenario_e2e_100(st, progress)
        peak = st.results["e2e-100"]["ack_rate"]
    rate = 0.5 * peak
    progress(
        f"latency: open-loop at 50% of the peak ({peak:,.0f} msg/s): {rate:,.0f} msg/s sent in batches of 10"
        f" and receive(10)+ack 1.1x as often, {st.procs} generator processes"
    )
    server = QueueServer(st.work_dir / "latency" / "data", st.out_dir / "latency.server.log")
    try:
        server.start()
        _put_queue(server.url)
        summary = run_load(st.spec("strictq", server.url, mode="open", rate=rate), st.procs, server.pid)
    finally:
        server.stop()
    progress(
        f"  latency: send p50 {summary.latency_ms('send_latency', 50):.2f} ms p99"
        f" {summary.latency_ms('send_latency', 99):.2f} ms; receive+ack p50"
        f" {summary.latency_ms('receive_ack_latency', 50):.2f} ms p99"
        f" {summary.latency_ms('receive_ack_latency', 99):.2f} ms; achieved {summary.send_rate:,.0f} sent/s,"
        f" {summary.ack_rate:,.0f} acked/s; server {100 * summary.server_cores:.0f}% CPU;"
        f" dropped {summary.dropped}"
    )
    st.results["latency"] = _summary(summary, peak=peak, target_rate=rate)


# ------------------------------------------------------------------------------------------- gateway
def _gateway_spec(st: Settings, target: str, gw: GatewayServer, **changes: Any) -> LoadSpec:
    """The e2e-100 load for a face of the gateway: the producer credential sends, worker-1..n consume."""
    creds = gw.credentials()
    producer = next(k for k, v in creds.items() if v["role"] == "producer")
    workers = sorted(k for k, v in creds.items() if v["role"] == "worker")
    credentials = {
        "producer": [producer, creds[producer]["secret"]],
        "workers": [[w, creds[w]["secret"]] for w in workers],
        "tenant": creds[producer]["tenant"],
    }
    queue = SQS_QUEUE if target == "sqs" else QUEUE
    return st.spec(target, gw.url, queue=queue, ca=gw.ca, credentials=credentials, **changes)


def _create_sqs_queue(gw: GatewayServer, spec: LoadSpec) -> str:
    """CreateQueue `bench.fifo` (FIFO, content-based deduplication) with the producer credential, SigV4."""
    import ssl

    import orjson
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    key, secret = spec.credentials["producer"]
    payload = orjson.dumps(
        {"QueueName": SQS_QUEUE, "Attributes": {"FifoQueue": "true", "ContentBasedDeduplication": "true"}}
    )
    signed = AWSRequest(
        method="POST",
        url=gw.url + "/",
        data=payload,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"},
    )
    SigV4Auth(Credentials(key, secret), "sqs", "us-east-1").add_auth(signed)
    request = urllib.request.Request(
        gw.url + "/", data=payload, method="POST", headers=dict(signed.headers.items())
    )
    context = ssl.create_default_context(cafile=gw.ca)
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return str(orjson.loads(response.read())["QueueUrl"])


def sigv4_verify_us(rounds: int = 2000) -> dict[str, float]:
    """The gateway's own SigV4 check (`gateway.sqs_auth.verify`, hand-written, signing key cached) on a
    signed ReceiveMessage request, beside its peer, botocore's SigV4Auth computing the expected signature
    over a rebuilt AWSRequest (how the gateway verified before), and botocore signing the same request:
    process CPU µs each, in this process."""
    import orjson
    from aiohttp.test_utils import make_mocked_request
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from access.keys import Credential
    from gateway.sqs_auth import parse_authorization, verify

    host = "127.0.0.1:8443"
    body = orjson.dumps(
        {"QueueUrl": f"https://{host}/dev/{SQS_QUEUE}", "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}
    )
    signer = SigV4Auth(Credentials("worker-1", "s3cret-s3cret-s3cret"), "sqs", "us-east-1")
    started = time.process_time()
    for _ in range(rounds):
        signed = AWSRequest(
            method="POST",
            url=f"http://{host}/",  # the scheme is not signed; the mocked request below is plain http
            data=body,
            headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": "AmazonSQS.ReceiveMessage",
            },
        )
        signer.add_auth(signed)
    sign_us = 1e6 * (time.process_time() - started) / rounds
    headers = {**dict(signed.headers.items()), "Host": host}
    request = make_mocked_request("POST", "/", headers=headers)
    credential = Credential("worker-1", "s3cret-s3cret-s3cret", "worker", "dev")
    verify(request, body, parse_authorization(request), credential)  # raises if the check fails
    started = time.process_time()
    for _ in range(rounds):
        verify(request, body, parse_authorization(request), credential)
    verify_us = 1e6 * (time.process_time() - started) / rounds
    started = time.process_time()
    for _ in range(rounds):
        auth = parse_authorization(request)
        names = auth.signed_headers
        rebuilt = AWSRequest(
            method="POST",
            url=f"http://{host}/",
            data=body,
            headers={name: ",".join(request.headers.getall(name)) for name in names},
        )
        rebuilt.context["timestamp"] = request.headers["X-Amz-Date"]
        peer = SigV4Auth(Credentials(credential.id, credential.secret), "sqs", auth.region)
        if peer.signed_headers(peer.headers_to_sign(rebuilt)) != ";".join(names):
            raise RuntimeError("botocore would sign other headers")
        expected = peer.signature(peer.string_to_sign(rebuilt, peer.canonical_request(rebuilt)), rebuilt)
        if expected != auth.signature:
            raise RuntimeError("botocore computes another signature")
    botocore_us = 1e6 * (time.process_time() - started) / rounds
    return {"verify_us": verify_us, "botocore_verify_us": botocore_us, "sign_us": sign_us}


def _internal_peak(st: Settings, progress: Progress, key: str) -> dict[str, Any]:
    internal = st.results.get("e2e-100")
    if not internal:
        progress(f"{key}: no internal-API figure in this run; measuring e2e-100 first")
        scenario_e2e_100(st, progress)
        internal = st.results["e2e-100"]
    return internal


def _gateway(st: Settings, progress: Progress, key: str, target: str) -> None:
    internal = _internal_peak(st, progress, key)
    face = {"emodb": "EmoDB face", "sqs": "SQS JSON face (SigV4)"}[target]
    progress(
        f"{key}: gateway (`strictq serve`, HTTPS, core in-process), {face}, send/poll/ack batch 10, 100"
        f" groups (one per send), {st.procs} generator processes x ({st.producers} producers +"
        f" {st.consumers} consumers), {st.warmup:g}s warm-up + {st.duration:g}s"
    )
    gw = GatewayServer(st.work_dir / key / "data", st.out_dir / f"{key}.server.log")
    profile = None
    try:
        gw.start()
        spec = _gateway_spec(st, target, gw)
        if target == "sqs":
            progress(f"  created {_create_sqs_queue(gw, spec)} (FIFO, ContentBasedDeduplication)")
        summary = _measure(st, spec, gw.pid, progress, key)
        if st.profile and pyspy_binary() is not None:
            progress(f"{key}: one more run with py-spy on the gateway (not counted)")
            profile = _pyspy_run(st, progress, gw, f"{key}-profile", spec)
    finally:
        gw.stop()
    progress(_load_line(key, summary) + f"; empty polls {summary.empty_receives:,}")
    sigv4 = None
    if target == "sqs":
        sigv4 = sigv4_verify_us()
        progress(
            f"  SigV4 in isolation (this process, CPU): the gateway's verify {sigv4['verify_us']:.1f} us per"
            f" request, botocore's signer verifying {sigv4['botocore_verify_us']:.1f} us, botocore signing"
            f" {sigv4['sign_us']:.0f} us"
        )
    edge = 1.0 - summary.ack_rate / internal["ack_rate"] if internal["ack_rate"] else float("nan")
    extra_us = summary.server_us_per_message() - internal["server_us_per_message"]
    line = (
        f"  edge cost = 1 - {summary.ack_rate:,.0f} / {internal['ack_rate']:,.0f} (internal API, e2e-100) ="
        f" {100 * edge:.0f}%; server CPU {extra_us:+.1f} us/msg over the internal API"
    )
    if summary.signs:
        line += f"; SigV4 signing in the generator {summary.sign_us:.0f} us per request"
    progress(line)
    st.results[key] = _summary(
        summary,
        face=target,
        internal_rate=internal["ack_rate"],
        internal_us_per_message=internal["server_us_per_message"],
        edge_cost=edge,
        profile=profile,
        sigv4=sigv4,
    )


def scenario_gw_emodb(st: Settings, progress: Progress) -> None:
    _gateway(st, progress, "gw-emodb", "emodb")


def scenario_gw_sqs(st: Settings, progress: Progress) -> None:
    _gateway(st, progress, "gw-sqs", "sqs")


def scenario_gw_latency(st: Settings, progress: Progress) -> None:
    peak = (st.results.get("gw-emodb") or {}).get("ack_rate")
    if not peak:
        progress("gw-latency: no EmoDB-face peak in this run; measuring gw-emodb first")
        scenario_gw_emodb(st, progress)
        peak = st.results["gw-emodb"]["ack_rate"]
    rate = 0.5 * peak
    progress(
        f"gw-latency: EmoDB face over HTTPS, open loop at 50% of its peak ({peak:,.0f} msg/s): {rate:,.0f}"
        f" msg/s sent as _sendbatch of 10 and poll(10)+ack 1.1x as often, {st.procs} generator processes"
    )
    gw = GatewayServer(st.work_dir / "gw-latency" / "data", st.out_dir / "gw-latency.server.log")
    try:
        gw.start()
        summary = run_load(_gateway_spec(st, "emodb", gw, mode="open", rate=rate), st.procs, gw.pid)
    finally:
        gw.stop()
    progress(
        f"  gw-latency: send p50 {summary.latency_ms('send_latency', 50):.2f} ms p99"
        f" {summary.latency_ms('send_latency', 99):.2f} ms; poll+ack p50"
        f" {summary.latency_ms('receive_ack_latency', 50):.2f} ms p99"
        f" {summary.latency_ms('receive_ack_latency', 99):.2f} ms; achieved {summary.send_rate:,.0f} sent/s,"
        f" {summary.ack_rate:,.0f} acked/s; server {100 * summary.server_cores:.0f}% CPU;"
        f" dropped {summary.dropped}; errors {summary.errors}"
    )
    st.results["gw-latency"] = _summary(summary, peak=peak, target_rate=rate)


# ------------------------------------------------------------------------------ backlog, restart, RSS
def scenario_backlog(st: Settings, progress: Progress) -> None:
    """Empty-queue baseline, then a preloaded backlog: start-up time, idle RSS, receive rate, restart."""
    n = st.backlog
    out: dict[str, Any] = {"backlog": n}
    # 1. Baseline: the same load on an initially empty queue (adjacent in time to the backlog run).
    progress(f"backlog: baseline, same load on an empty queue ({st.warmup:g}s + {st.duration:g}s)")
    server = QueueServer(st.work_dir / "empty" / "data", st.out_dir / "backlog-empty.server.log")
    try:
        server.start()
        out["rss_empty"] = _idle_rss(server)
        _put_queue(server.url)
        empty = _measure(st, st.spec("strictq", server.url), server.pid, progress, "empty queue")
    finally:
        server.stop()
    progress(_load_line("empty queue", empty))
    out["empty"] = _summary(empty)

    # 2. Preload the backlog straight into a store (see preload.py for why that is faithful).
    data = st.work_dir / "backlog" / "data"
    progress(f"backlog: preloading {n:,} messages of 256 bytes in 100 groups through QueueCore + SqliteStore")
    info = preload(data, QUEUE, n, 100, 256)
    out["preload_seconds"] = info.seconds
    out["db_bytes"] = info.db_bytes
    progress(f"  preloaded in {info.seconds:.1f}s; store {info.db_bytes / 1e6:,.0f} MB")

    # 3. Start on it: time to `listening`, the server's own `restored in`, idle RSS with n queued.
    server = QueueServer(data, st.out_dir / "backlog.server.log")
    try:
        server.start()
        out["start_seconds"] = server.startup_seconds
        out["start_restored"] = server.restored_seconds()
        out["rss_backlog"] = _idle_rss(server)
        out["queued_at_start"] = _queue_size(server.url)
        progress(
            f"  started with {out['queued_at_start']:,} queued: listening after {server.startup_seconds:.2f}s"
            f" (restored in {out['start_restored']}s), idle RSS {out['rss_backlog'] / 2**20:,.0f} MiB"
        )
        # 4. The same load with the backlog in front of it.
        progress(f"backlog: load with {n:,} queued ({st.warmup:g}s + {st.duration:g}s)")
        loaded = _measure(st, st.spec("strictq", server.url), server.pid, progress, "backlog")
        out["rss_after_load"] = server.rss()
        out["queued_after_load"] = _queue_size(server.url)
        if st.profile and pyspy_binary() is not None:
            progress("backlog: one more run with py-spy on the server (not counted)")
            out["profile"] = _pyspy_run(st, progress, server, "backlog-profile")
    finally:
        server.stop()
    progress(_load_line(f"{n:,} backlog", loaded))
    out["loaded"] = _summary(loaded)
    out["ratio"] = loaded.receive_rate / empty.receive_rate if empty.receive_rate else float("nan")
    progress(f"  receive-rate ratio backlog/empty: {out['ratio']:.2f}")

    # 5. Restart after that traffic (claims, deletes and new rows in the store): the restart figure.
    server = QueueServer(data, st.out_dir / "restart.server.log")
    try:
        server.start()
        out["restart_seconds"] = server.startup_seconds
        out["restart_restored"] = server.restored_seconds()
        out["rss_restarted"] = _idle_rss(server)
        out["queued_at_restart"] = _queue_size(server.url)
    finally:
        server.stop()
    queued = out["queued_at_start"]
    out["rss_per_message"] = (out["rss_backlog"] - out["rss_empty"]) / queued if queued else float("nan")
    q2 = out["queued_at_restart"]
    out["rss_per_message_restarted"] = (out["rss_restarted"] - out["rss_empty"]) / q2 if q2 else float("nan")
    progress(
        f"  restart with {q2:,} queued: listening after {out['restart_seconds']:.2f}s (restored in"
        f" {out['restart_restored']}s); RSS per queued message {out['rss_per_message']:.0f} B"
        f" (after restart: {out['rss_per_message_restarted']:.0f} B)"
    )
    out["groups10k"] = _backlog_in_groups(st, progress, n, BACKLOG_GROUPS_WIDE)
    st.results["backlog"] = out


BACKLOG_GROUPS_WIDE = 10_000


def _backlog_in_groups(st: Settings, progress: Progress, n: int, groups: int) -> dict[str, Any]:
    """The receive-rate ratio again with the backlog and the load spread over `groups` groups, beside its
    own empty-queue baseline over as many groups (each group's head is then a few keys from the next one's
    only every `groups` messages: body reads cannot ride on key order)."""
    spec_changes = {"groups": groups}
    progress(f"backlog ({groups:,} groups): baseline, same load on an empty queue")
    server = QueueServer(
        st.work_dir / f"empty-{groups}" / "data", st.out_dir / f"backlog-empty-{groups}.server.log"
    )
    try:
        server.start()
        _put_queue(server.url)
        empty = _measure(
            st, st.spec("strictq", server.url, **spec_changes), server.pid, progress, "empty queue"
        )
    finally:
        server.stop()
    progress(_load_line(f"empty queue, {groups:,} groups", empty))
    data = st.work_dir / f"backlog-{groups}" / "data"
    progress(f"backlog: preloading {n:,} messages of 256 bytes in {groups:,} groups")
    info = preload(data, QUEUE, n, groups, 256)
    server = QueueServer(data, st.out_dir / f"backlog-{groups}.server.log")
    try:
        server.start()
        restored = server.restored_seconds()
        loaded = _measure(st, st.spec("strictq", server.url, **spec_changes), server.pid, progress, "backlog")
    finally:
        server.stop()
    ratio = loaded.receive_rate / empty.receive_rate if empty.receive_rate else float("nan")
    progress(_load_line(f"{n:,} backlog, {groups:,} groups", loaded))
    progress(f"  receive-rate ratio backlog/empty, {groups:,} groups: {ratio:.2f}")
    return {
        "groups": groups,
        "preload_seconds": info.seconds,
        "start_restored": restored,
        "empty": _summary(empty),
        "loaded": _summary(loaded),
        "ratio": ratio,
    }


# --------------------------------------------------------------------------------------------- redis
def scenario_redis(st: Settings, progress: Progress) -> None:
    binary = RedisServer.binary()
    if binary is None:
        progress("redis: redis-server not installed (apt-get install -y redis-server); skipped")
        st.results["redis"] = {"skipped": "redis-server not installed"}
        return
    redis = RedisServer(st.work_dir / "redis")
    try:
        redis.start()
        progress(
            f"redis: {redis.version.split(' sha=')[0]} on 127.0.0.1:{redis.port}, appendonly yes, appendfsync"
            f" always; XADD x10 pipelined / XREADGROUP COUNT 10 / XACK+XDEL, same generator design"
        )
        _redis_setup(redis.port)
        summary = _measure(st, st.spec("redis", f"127.0.0.1:{redis.port}"), redis.pid, progress, "redis")
    finally:
        redis.stop()
    progress(_load_line("redis", summary).replace("(loop", "(main").replace("writer", "other threads"))
    st.results["redis"] = _summary(summary, version=redis.version)


def _redis_setup(port: int) -> None:
    import redis as redis_sync

    client = redis_sync.Redis(host="127.0.0.1", port=port)
    try:
        client.xgroup_create(QUEUE, "bench", id="$", mkstream=True)
    finally:
        client.close()


# ------------------------------------------------------------------------------------------- profile
def scenario_profile(st: Settings, progress: Progress) -> None:
    """The e2e-100 load once more, with a profiler on the server (figures of this run are not reported)."""
    if pyspy_binary() is not None:
        _profile_pyspy(st, progress)
    else:
        _profile_pyinstrument(st, progress)


def _profile_pyspy(st: Settings, progress: Progress) -> None:
    progress(
        f"profile: e2e-100 load; py-spy samples every server thread at {RATE}/s (native frames, idle"
        " included) during the measured window"
    )
    server = QueueServer(st.work_dir / "profile" / "data", st.out_dir / "profile.server.log")
    try:
        server.start()
        _put_queue(server.url)
        st.results["profile"] = _pyspy_run(st, progress, server, "profile")
    finally:
        server.stop()


def _pyspy_run(
    st: Settings, progress: Progress, server: QueueServer, name: str, spec: LoadSpec | None = None
) -> dict[str, Any]:
    """One e2e-100 load run (or `spec`) with py-spy attached to `server` for the window; the run's figures
    are kept apart (sampling pauses the server) and only the breakdown is reported."""
    raw = st.out_dir / f"{name}.pyspy.txt"
    raw.unlink(missing_ok=True)
    spies: list[subprocess.Popen[bytes]] = []
    try:
        summary = run_load(
            spec or st.spec("strictq", server.url),
            st.procs,
            server.pid,
            on_window=lambda seconds: spies.append(start_pyspy(server.pid, seconds, raw)),
        )
        for spy in spies:
            _, err = spy.communicate(timeout=60)
            if spy.returncode != 0:
                raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.kill()
                spy.wait(10)
    progress(_load_line(f"{name} (sampled)", summary))
    analysis = analyze_pyspy(raw)
    for thread, categories in analysis["threads"].items():
        total = sum(categories.values()) or 1
        top = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in list(categories.items())[:4])
        progress(f"  {thread}: {top}")
    return {
        "tool": "py-spy",
        "raw": raw.name,
        "summary": _summary(summary),
        "analysis": analysis,
        "markdown": render_pyspy(analysis),
    }


def _profile_pyinstrument(st: Settings, progress: Progress) -> None:
    session = st.out_dir / "profile.pyisession"
    progress("profile: py-spy not installed; e2e-100 load against the server run under pyinstrument")
    server = QueueServer(
        st.work_dir / "profile" / "data", st.out_dir / "profile.server.log", profile_to=session
    )
    try:
        server.start()
        _put_queue(server.url)
        summary = run_load(st.spec("strictq", server.url), st.procs, server.pid)
    finally:
        server.stop()
    progress(_load_line("profiled", summary))
    text = "(no profile written)"
    if session.exists():
        out = st.out_dir / "profile.pyinstrument.txt"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pyinstrument",
                "--load",
                str(session),
                "-r",
                "text",
                "--no-color",
                "-p",
                "processor_options.filter_threshold=0.01",
                "-o",
                str(out),
            ],
            check=True,
            timeout=300,
        )
        text = out.read_text()
    st.results["profile"] = {"tool": "pyinstrument", "summary": _summary(summary), "text": text}


def scenario_spark(st: Settings, progress: Progress) -> None:
    """Wire-log search: index build, lookups, brute force, size (bench/spark_bench.py)."""
    from .spark_bench import run_spark_bench

    st.results["spark"] = run_spark_bench(st.work_dir, st.quick, st.out_dir, progress)


def scenario_failover(st: Settings, progress: Progress) -> None:
    """Failure management: time to fence, recovery to delivery (bench/failure_bench.py)."""
    from .failure_bench import run_failover_bench

    st.results["failover"] = run_failover_bench(st.work_dir, st.quick, progress)


def scenario_cluster(st: Settings, progress: Progress) -> None:
    """`strictq cluster up`: gateway throughput at 1-3 queue servers, R1/R3; failover; moves (issue 15)."""
    from .cluster_bench import run_cluster_bench

    st.results["cluster"] = run_cluster_bench(st, progress)


def scenario_geo(st: Settings, progress: Progress) -> None:
    """Regions (issue 16): send latency per region before/after placement, follow-the-sun (geo_bench.py)."""
    from .geo_bench import run_geo_bench

    st.results["geo"] = run_geo_bench(st, progress)


def scenario_noisy(st: Settings, progress: Progress) -> None:
    """Noisy neighbour (issue 17): a tenant's flood against another, fairness, the protections' cost."""
    from .noisy_bench import run_noisy_bench

    st.results["noisy"] = run_noisy_bench(st, progress)


def scenario_rollout(st: Settings, progress: Progress) -> None:
    """Rollouts (issue 18): a step's latency to the canary, group routing's cost in the core."""
    from .rollout_bench import run_rollout_bench

    st.results["rollout"] = run_rollout_bench(st, progress)


def scenario_state(st: Settings, progress: Progress) -> None:
    """State transfer (issue 18): local state moving with its groups, time per MiB (state_bench.py)."""
    from .state_bench import run_state_bench

    st.results["state"] = run_state_bench(st, progress)


def scenario_pipeline(st: Settings, progress: Progress) -> None:
    """Pipelining (issue 18): throughput with and without pre-processing overlapped (pipeline_bench.py)."""
    from .pipeline_bench import run_pipeline_bench

    st.results["pipeline"] = run_pipeline_bench(st, progress)


def scenario_longpoll(st: Settings, progress: Progress) -> None:
    """Long polls (issue 19): waiting workers woken one at a time against all at once (long_poll_bench.py)."""
    from .long_poll_bench import run_long_poll_bench

    st.results["longpoll"] = run_long_poll_bench(st, progress)


SCENARIOS: dict[str, Callable[[Settings, Progress], None]] = {
    "core": scenario_core,
    "e2e-100": scenario_e2e_100,
    "e2e-10k": scenario_e2e_10k,
    "latency": scenario_latency,
    "gw-emodb": scenario_gw_emodb,
    "gw-sqs": scenario_gw_sqs,
    "gw-latency": scenario_gw_latency,
    "backlog": scenario_backlog,
    "redis": scenario_redis,
    "proxy": scenario_proxy,
    "spark": scenario_spark,
    "failover": scenario_failover,
    "cluster": scenario_cluster,
    "geo": scenario_geo,
    "noisy": scenario_noisy,
    "rollout": scenario_rollout,
    "state": scenario_state,
    "pipeline": scenario_pipeline,
    "longpoll": scenario_longpoll,
    "profile": scenario_profile,
}
ALIASES = {
    "gw": ["gw-emodb", "gw-sqs", "gw-latency"],
    "gateway": ["gw-emodb", "gw-sqs", "gw-latency"],
    "e2e": ["e2e-100", "e2e-10k"],
    "restart": ["backlog"],
    "rss": ["backlog"],
}
