"""The internal API does not trust its network (issue 27, item 5; queue_core.internal_auth).

Against real processes on loopback: a `strictq queue-server` behind `strictq serve --queue-server URL`,
and a cluster node started by `strictq cluster up` (which must hand its nodes and its edge the secret
itself: the run's STRICTQ_INTERNAL_SECRET_FILE is emptied for it). Each attack of issue 27 (list queues,
peek bodies, forge a send, claim, delete by id, purge, delete the queue, change attributes, start a move),
without the secret and with a wrong one: refused with 401 / 403 and the JSON error body, and nothing
changed, as the gateway reports the queue (attributes, size, peek, the queue list) before and after. Then
the start-up lines: no secret for a gateway or a node, a file other users may read, a wrong secret.
"""

from __future__ import annotations

import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from cluster_support import READY, UP_TIMEOUT, sqs_at
from conftest import INTERNAL_SECRET_FILE
from kit.process import LISTENING, ROOT, launch, strictq
from kit.secret import internal_headers
from topologies import Edge, running_edge

from access.keys import Credential, KeyRing
from protocol.headers import API_KEY, INTERNAL_SECRET, PARTITION
from queue_core.internal_auth import ENV

QUEUE = "victim"
BODIES = ["card 4111-1111-1111-1111", "card 5500-0000-0000-0004", "card 3400-000000-00009"]
NO_SECRET = {ENV: ""}  # the run's secret file withheld from a process (an empty variable names none)
CLI_TIMEOUT = 60.0


@dataclass
class Target:
    """One internal port under attack, and the gateway that reports what its queue holds."""

    name: str
    internal: str  # the queue server's (or node's) URL
    gateway: str
    ca: str
    keys: KeyRing
    partitions: list[int | None]  # the X-Strictq-Partition values to attack with (None: no header)
    secret_file: Path | None = None  # the deployment's secret (None: the run's, tests/conftest.py)
    nats_args: tuple[str, ...] = ()  # a cluster's --cluster and --nats-credentials

    def credential(self, role: str) -> Credential:
        return next(c for c in self.keys.credentials if c.role == role)

    def sqs(self) -> Any:
        return sqs_at(self.gateway, self.ca, self.credential("admin"), attempts=3)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with running_edge("remote", tmp_path_factory.mktemp("remote")) as edge:
        server = edge.processes[0]
        yield target_of("remote", server.startup[LISTENING], edge, [None])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """`strictq cluster up` (one JetStream server, one node, two partitions) without the run's secret in
    its environment: its nodes and edge work only if it passes them DIR/internal.secret."""
    data_dir = tmp_path_factory.mktemp("cluster") / "up"
    argv = strictq(
        "cluster", "up", "--nodes", "1", "--replicas", "1", "--nats-servers", "1", "--partitions", "2",
        "--port", "0", "--no-proxy", "--data-dir", str(data_dir),
    )  # fmt: skip
    process = launch(
        argv, data_dir.parent / "cluster-up.log", wait_for=(READY,), timeout=UP_TIMEOUT, env=NO_SECRET
    )
    try:
        secret_line = process.value("strictq: internal secret ")
        assert secret_line == str((data_dir / "internal.secret").resolve()), process.lines
        assert (data_dir / "internal.secret").stat().st_mode & 0o777 == 0o600
        node_url = next(line.split()[-1] for line in process.lines if line.startswith("strictq: node "))
        edge = Edge(
            kind="cluster",
            url=process.value(LISTENING) or "",
            ca=process.value("strictq: ca ") or "",
            keys_path=Path(process.value("strictq: keys ") or ""),
            env_path=data_dir / "gateway" / "client.env",
            data_dir=data_dir,
            processes=[process],
        )
        found = target_of("cluster", node_url, edge, [0, 1])
        found.secret_file = data_dir / "internal.secret"
        nats = "strictq: nats "
        urls = ",".join(line[len(nats) :] for line in process.lines if line.startswith(nats))
        found.nats_args = ("--cluster", urls, "--nats-credentials", str(data_dir / "nats" / "credentials"))
        yield found
    finally:
        process.stop()


def target_of(name: str, internal: str, edge: Edge, partitions: list[int | None]) -> Target:
    return Target(name, internal, edge.url, edge.ca, edge.keys, partitions)


@pytest.fixture(params=["remote", "cluster"])
def target(request: pytest.FixtureRequest) -> Target:
    found: Target = request.getfixturevalue(request.param)
    return found


# ----------------------------------------------------------------------------------- what the edge says
async def gateway_view(target: Target, session: aiohttp.ClientSession, queue_url: str) -> dict[str, Any]:
    """The queue as the gateway reports it: SQS attributes (without the clock's), EmoDB size and peek
    (bodies and ids), and the SQS queue list."""
    sqs = target.sqs()
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    for volatile in ("LastModifiedTimestamp",):
        attributes.pop(volatile, None)
    key = {API_KEY: target.credential("admin").secret}
    base = f"{target.gateway}/queue/1/{QUEUE}"
    async with session.get(base + "/size", headers=key) as response:
        assert response.status == 200, await response.text()
        size = await response.json()
    async with session.get(base + "/peek", params={"limit": "100"}, headers=key) as response:
        assert response.status == 200, await response.text()
        peeked = await response.json()
    queues = sorted(sqs.list_queues().get("QueueUrls", []))
    return {"attributes": attributes, "size": size, "peek": peeked, "queues": queues}


async def internal_names(target: Target, session: aiohttp.ClientSession) -> tuple[str, list[str]]:
    """The gateway's queue as the internal API names it, and its message ids (asked with the secret)."""
    headers = {**internal_headers_of(target)}
    for partition in target.partitions:
        if partition is not None:
            headers[PARTITION] = str(partition)
        async with session.get(target.internal + "/v1/queues", headers=headers) as response:
            assert response.status == 200, await response.text()
            names = [n for n in (await response.json())["queues"] if n.endswith(QUEUE)]
        if names:
            ids: list[str] = []
            for p in target.partitions:
                if p is not None:
                    headers[PARTITION] = str(p)
                path = f"{target.internal}/v1/queues/{names[0]}/peek"
                async with session.get(path, params={"limit": "100"}, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    ids += [m["id"] for m in (await response.json())["messages"]]
            return names[0], ids
    raise AssertionError(f"no internal queue ending in {QUEUE!r} on {target.internal}")


def internal_headers_of(target: Target) -> dict[str, str]:
    """The secret of the target's deployment: the run's, or the one `cluster up` wrote."""
    if target.secret_file is None:
        return internal_headers()
    return {INTERNAL_SECRET: target.secret_file.read_text().strip()}


def attacks(queue: str, ids: list[str]) -> list[tuple[str, str, str, Any]]:
    """(what, method, path, JSON body) of each attack of issue 27, plus the queue's info and figures."""
    q = f"/v1/queues/{queue}"
    return [
        ("list every tenant's queues", "GET", "/v1/queues", None),
        ("read bodies with peek", "GET", q + "/peek?limit=100", None),
        ("queue info", "GET", q, None),
        ("figures", "GET", "/v1/figures", None),
        ("forge a message", "POST", q + "/send", {"messages": [{"body": "forged", "group": "customer-1"}]}),
        ("claim for 5 minutes", "POST", q + "/receive", {"limit": 10, "ttl": 300, "worker": "mallory"}),
        ("delete by id", "POST", q + "/ack", {"ids": ids}),
        ("purge", "POST", q + "/purge", None),
        ("delete the queue", "DELETE", q, None),
        ("change attributes", "PATCH", q, {"attributes": {"visibility_timeout": 1}}),
        ("start a move", "POST", "/v1/moves", {"from": queue, "to": queue + "-hidden"}),
    ]


# ------------------------------------------------------------------------------------------- tests
async def test_every_attack_is_refused_and_changes_nothing(target: Target) -> None:
    sqs = target.sqs()
    queue_url = sqs.create_queue(QueueName=QUEUE)["QueueUrl"]
    for body in BODIES:
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=target.ca))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        before = await gateway_view(target, session, queue_url)
        assert before["size"] == len(BODIES), before
        queue, ids = await internal_names(target, session)
        assert len(ids) == len(BODIES)
        for what, method, path, body in attacks(queue, ids):
            for partition in target.partitions:
                for secret, status, code in ((None, 401, "unauthorized"), ("wrong-" * 8, 403, "forbidden")):
                    headers = {} if partition is None else {PARTITION: str(partition)}
                    if secret is not None:
                        headers[INTERNAL_SECRET] = secret
                    data = None if body is None else orjson.dumps(body)
                    if data is not None:
                        headers["Content-Type"] = "application/json"
                    async with session.request(
                        method, target.internal + path, data=data, headers=headers
                    ) as response:
                        answer = await response.read()
                        assert response.status == status, (what, partition, response.status, answer)
                        assert response.content_type == "application/json", (what, answer)
                        error = orjson.loads(answer)["error"]
                        assert error["code"] == code and error["message"], (what, error)
                        assert "wrong-" not in error["message"]  # the given secret is never echoed
        after = await gateway_view(target, session, queue_url)
    assert after == before


async def test_probes_answer_without_the_secret_and_say_nothing(target: Target) -> None:
    """/healthz and /readyz serve load balancers without a secret (they reveal nothing but liveness);
    a wrong secret is refused there too, so a misconfigured gateway's readiness probe says so."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(target.internal + "/healthz") as response:
            assert response.status == 200 and await response.json() == {"status": "ok"}
        async with session.get(target.internal + "/readyz") as response:
            assert response.status == 200 and await response.json() == {"ready": True}
        async with session.get(target.internal + "/readyz", headers={INTERNAL_SECRET: "x" * 20}) as response:
            assert response.status == 403, await response.text()
        async with session.get(target.internal + "/readyz", headers=internal_headers_of(target)) as response:
            assert response.status == 200


# ------------------------------------------------------------------------------------ start-up lines
def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        strictq(*args),
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [
        line for line in done.stderr.splitlines() if line.startswith("strictq: ") and "stopping" not in line
    ]
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_gateway_without_the_secret_is_refused_at_start(tmp_path: Path) -> None:
    done = run_cli(
        "serve", "--queue-server", "http://127.0.0.1:9", "--no-proxy", "--port", "0",
        "--data-dir", str(tmp_path / "edge"), env=NO_SECRET,
    )  # fmt: skip
    one_line(done, 2, "--internal-secret", ENV, "internal.secret", "strictq: internal secret")
    done = run_cli(
        "serve", "--cluster", "nats://u:p@127.0.0.1:9", "--no-proxy", "--port", "0",
        "--data-dir", str(tmp_path / "cluster-edge"), env=NO_SECRET,
    )  # fmt: skip
    one_line(done, 2, "--internal-secret", ENV, "cluster up")


def test_a_node_without_the_secret_is_refused_at_start(tmp_path: Path) -> None:
    done = run_cli(
        "queue-server", "--cluster", "nats://u:p@127.0.0.1:9", "--node", "n1", "--port", "0",
        "--data-dir", str(tmp_path / "node"), env=NO_SECRET,
    )  # fmt: skip
    one_line(done, 2, "--internal-secret", ENV, "cluster up")


def test_a_secret_file_others_may_read_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose.secret"
    loose.write_text(INTERNAL_SECRET_FILE.read_text())
    loose.chmod(0o640)
    for args in (
        ("queue-server", "--port", "0", "--data-dir", str(tmp_path / "qs")),
        (
            "serve",
            "--queue-server",
            "http://127.0.0.1:9",
            "--no-proxy",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "edge"),
        ),
        (
            "queue-server",
            "--cluster",
            "nats://u:p@127.0.0.1:9",
            "--node",
            "n1",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "n"),
        ),
    ):
        one_line(run_cli(*args, "--internal-secret", str(loose)), 2, str(loose), "0640", "chmod 600")
    done = run_cli("queue-server", "--port", "0", "--data-dir", str(tmp_path / "qs2"), env={ENV: str(loose)})
    one_line(done, 2, "0640", "the group")
    short = tmp_path / "short.secret"  # not a secret: too short to guess at
    short.write_text("abc\n")
    short.chmod(0o600)
    for path, words in ((short, ("not an internal secret",)), (tmp_path, ("not a file",))):
        done = run_cli(
            "queue-server", "--port", "0", "--data-dir", str(tmp_path / "qs3"), "--internal-secret", str(path)
        )
        one_line(done, 2, str(path), *words)


def test_a_queue_server_writes_its_secret_and_says_where(tmp_path: Path) -> None:
    data_dir = tmp_path / "qs"
    server = launch(
        strictq("queue-server", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir)),
        tmp_path / "qs.log",
        wait_for=(LISTENING, "strictq: internal secret "),
        env=NO_SECRET,
    )
    try:
        path = data_dir / "internal.secret"
        assert server.value("strictq: internal secret ") == str(path.resolve())
        assert path.stat().st_mode & 0o777 == 0o600
        assert len(path.read_text().strip()) >= 32
        url = server.startup[LISTENING]
        # The CLI against it: refused without the secret (the server's message names the variable), served
        # with it.
        refused = run_cli("queues", "--queue-server", url, env=NO_SECRET)
        one_line(refused, 1, "401 unauthorized", ENV)
        served = run_cli("queues", "--queue-server", url, env={ENV: str(path)})
        assert served.returncode == 0, served.stderr
    finally:
        server.stop()


def test_a_gateway_with_another_secret_is_refused_at_start(
    remote: Target, cluster: Target, tmp_path: Path
) -> None:
    other = tmp_path / "other.secret"
    other.write_text("another-secret-of-32-characters-x\n")
    other.chmod(0o600)
    done = run_cli(
        "serve", "--queue-server", remote.internal, "--internal-secret", str(other), "--no-proxy",
        "--port", "0", "--data-dir", str(tmp_path / "edge"),
    )  # fmt: skip
    one_line(done, 2, "refuses", "internal secret", "403")
    assert cluster.nats_args, "the cluster fixture records its NATS arguments"
    done = run_cli(
        "serve", *cluster.nats_args, "--internal-secret", str(other), "--no-proxy",
        "--port", "0", "--data-dir", str(tmp_path / "cluster-edge"),
    )  # fmt: skip
    one_line(done, 2, "refuses", "internal secret", "403")


def test_the_internal_api_over_tls(tmp_path: Path) -> None:
    """--tls-cert/--tls-key on the queue server, --internal-ca on the gateway: the secret crosses the
    network encrypted; a plain-HTTP caller gets no answer at all, the gateway serves as before."""
    from gateway.tls import ensure_local_certificates

    files = ensure_local_certificates(tmp_path / "tls")
    assert files.ca is not None
    server = launch(
        strictq(
            "queue-server", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "qs"),
            "--tls-cert", str(files.cert), "--tls-key", str(files.key),
        ),
        tmp_path / "qs.log",
    )  # fmt: skip
    try:
        url = server.startup[LISTENING]
        assert url.startswith("https://127.0.0.1:"), url
        plain = run_cli("queues", "--queue-server", url.replace("https://", "http://"))
        assert plain.returncode != 0 and "Traceback" not in plain.stderr, plain.stderr
        gateway = launch(
            strictq(
                "serve", "--queue-server", url, "--internal-ca", str(files.ca), "--no-proxy",
                "--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "edge"),
            ),
            tmp_path / "edge.log",
            wait_for=(LISTENING, "strictq: client env "),
        )  # fmt: skip
        try:
            keys = KeyRing.load(Path(gateway.value("strictq: keys ") or ""))
            admin = next(c for c in keys.credentials if c.role == "admin")
            sqs = sqs_at(gateway.startup[LISTENING], gateway.value("strictq: ca ") or "", admin, attempts=3)
            queue_url = sqs.create_queue(QueueName="over-tls")["QueueUrl"]
            sqs.send_message(QueueUrl=queue_url, MessageBody="hello")
            got = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5)["Messages"]
            assert [m["Body"] for m in got] == ["hello"]
        finally:
            gateway.stop()
        served = run_cli("queues", "--queue-server", url, env={"STRICTQ_CA_FILE": str(files.ca)})
        assert served.returncode == 0 and "over-tls" in served.stdout, served.stderr
    finally:
        server.stop()


@pytest.mark.parametrize(
    "path",
    ["/admin/../v1/queues", "/admin%2F..%2Fv1/queues", "/metrics/../v1/queues", "/healthz/../v1/queues",
     "//v1/queues", "/v1/queues/"],
)  # fmt: skip
def test_no_path_trick_reaches_a_route_without_the_secret(remote: Target, path: str) -> None:
    """The check goes by the route that would serve the request, not by the raw path: dot segments, an
    encoded slash or a doubled one reach no route (404), never the queue list."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(remote.internal)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15)
    try:
        conn.request("GET", path)  # as given: http.client does not normalize it
        answer = conn.getresponse()
        status, body = answer.status, answer.read()
    finally:
        conn.close()
    assert status in (401, 404), (path, status, body)
    answer_json = orjson.loads(body)
    assert "error" in answer_json and "queues" not in answer_json, body  # an error, never the listing
