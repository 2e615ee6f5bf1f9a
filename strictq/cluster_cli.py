"""`strictq cluster up | status | move | urls`: run a cluster on one machine, look at one, move a partition.

The commands import the cluster's packages when they run, so `strictq --help` stays fast. status and move
find the cluster by the data dir of `strictq cluster up` (its recorded NATS ports and credentials) or by
`--cluster NATS_URLS --nats-credentials FILE` (another machine's cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = Path("var/strictq-cluster")  # make cluster's (DATA_DIR-cluster)
MAX_NODES = 64
MAX_NATS_SERVERS = 9
MOVE_POLL = 0.25
PROGRESS_EVERY = 1.0

UP_EPILOG = """\
Output: the gateway's start-up lines as `strictq serve` prints them (listening on, ca, keys, proxy on,
proxy ca, client env, try), then `strictq: node <name> pid <pid> <url>` per queue server, `strictq: nats
<url>` per JetStream server and `strictq: cluster ready` last. Load the client environment with
`set -a; . DIR/gateway/client.env; set +a`.

Files under DIR: nats/ (the JetStream servers: nats/credentials, nats/ports.json, nats/n<K>/server.log),
nodes/n<K>/ (each queue server's stores), gateway/ (the gateway's TLS, keys and client.env) and logs/: the
stderr of each queue server (logs/n<K>.log) and of the gateway (logs/gateway.log). A child that fails to
start has its last log lines shown here.

A child that dies later is reported in one line on stderr and not restarted: its partitions fail over to
a standby. SIGTERM or Ctrl-C stops the gateway, then the queue servers, then JetStream. Running it again
on the same DIR restarts the same cluster (same NATS ports and password, same node directories); a second
one on a running DIR is refused.

Add a queue server to the running cluster (it follows every partition, then the master gives it some):
  strictq queue-server --cluster "$(strictq cluster urls --data-dir DIR)" \\
    --nats-credentials DIR/nats/credentials --node n4 --data-dir DIR/nodes/n4 --port 0
See docs/cluster.md for a layout over three machines."""

STATUS_EPILOG = """\
--json prints one object: {"cluster": {"id", "partitions", "replicas", "nats": [url...]}, "partitions":
[{"partition", "owner", "epoch", "serving", "last_seq", "moving_to", "standbys": [{"node", "applied",
"lag"}]}], "nodes": [{"node", "pid", "url", "state" ("alive" | "stale"), "age" (seconds since its last
heartbeat), "serving": [partition...], "applied": {"partition": position}}]}. A standby's lag is the
stream's last sequence minus the position it has applied. Exit 1 when there is no cluster there."""


def register(commands: Any) -> None:
    group = commands.add_parser(
        "cluster",
        help="the distributed queue: start one on this machine, show it, move a partition",
        description="A cluster of queue servers whose partitions are replicated on NATS JetStream "
        "(docs/cluster.md).",
    )
    sub = group.add_subparsers(title="cluster commands", metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="start JetStream servers, queue servers and a gateway on this machine",
        description="Start, on this machine, NATS JetStream servers, NODES queue servers and one gateway "
        "(`strictq serve --cluster`, with its egress proxy child), and supervise them until SIGTERM or "
        "Ctrl-C.",
        epilog=UP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--nodes", type=int, default=3, help="queue servers, n1..nN (default: %(default)s)")
    _data_dir_argument(up)
    up.add_argument(
        "--replicas",
        type=int,
        choices=(1, 3),
        default=3,
        help="JetStream replicas of a new cluster's streams (default: %(default)s)",
    )
    up.add_argument(
        "--partitions",
        type=int,
        default=3,
        help="cluster partitions of a new cluster, the unit of ownership (fixed once created; default: "
        "%(default)s)",
    )
    up.add_argument("--host", default="127.0.0.1", help="address every piece binds (default: %(default)s)")
    up.add_argument(
        "--port", type=int, default=8443, help="the gateway's port; 0 picks a free one (default: %(default)s)"
    )
    up.add_argument(
        "--proxy-port",
        type=int,
        help="the egress proxy's port (default: 8480, or a free one with --port 0)",
    )
    up.add_argument(
        "--no-proxy", dest="proxy", action="store_false", help="start the gateway without its egress proxy"
    )
    up.add_argument(
        "--nats-servers",
        type=int,
        default=3,
        metavar="N",
        help="JetStream servers (at least 3 for --replicas 3; 1 is enough for --replicas 1; default: "
        "%(default)s; fixed once the data dir has them)",
    )
    up.set_defaults(handler=cmd_up)

    status = sub.add_parser(
        "status",
        help="partitions (owner, epoch, standbys' lag) and nodes (pid, state)",
        description="Show each partition's owner, epoch, stream position and standbys with their lag, and "
        "each queue server's pid, URL, state and the partitions it serves.",
        epilog=STATUS_EPILOG,
    )
    status.add_argument("--json", action="store_true", help="one JSON object (shape below)")
    _where_arguments(status)
    status.set_defaults(handler=cmd_status)

    move = sub.add_parser(
        "move",
        help="hand a partition over to another queue server (planned, keeping per-group order)",
        description="Ask the master to move PARTITION to NODE: NODE catches up on the partition's "
        "stream, the owner stops serving it, NODE opens it with the next epoch. Waits until NODE serves it.",
    )
    move.add_argument("partition", metavar="PARTITION", help="partition number (0..partitions-1)")
    move.add_argument("node", metavar="NODE", help="a live queue server's name (strictq cluster status)")
    move.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="give up waiting after this long (the request stays; default: %(default)s)",
    )
    _where_arguments(move)
    move.set_defaults(handler=cmd_move)

    urls = sub.add_parser(
        "urls",
        help="the JetStream servers of a `cluster up` data dir, as a --cluster value",
        description="Print the nats:// URLs of the JetStream servers `strictq cluster up` runs in DIR, "
        "comma-separated: the --cluster value of `strictq queue-server` and `strictq serve`.",
    )
    _data_dir_argument(urls)
    urls.set_defaults(handler=cmd_urls)

    group.set_defaults(handler=lambda args: _usage(group))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    print("strictq: give a cluster command: up, status, move or urls", file=sys.stderr)
    return 2


def _data_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help="the cluster's directory (default: %(default)s, make cluster's)",
    )


def _where_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group(
        "which cluster", f"the data dir of `strictq cluster up` (default: {DEFAULT_DATA_DIR}), or --cluster"
    )
    where.add_argument("--data-dir", type=Path, metavar="DIR", help="the data dir of `strictq cluster up`")
    add_nats_arguments(where)


# The --cluster flags of `strictq queue-server`, `strictq serve` and the cluster commands (strictq.cli imports
# them from here: this module imports nothing of strictq.cli, so the two never import each other).
def add_nats_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--cluster",
        metavar="NATS_URLS",
        help="the cluster's JetStream servers, nats://host:port[,nats://host:port...] (credentials in the "
        "URL as nats://user:password@host:port, or in --nats-credentials)",
    )
    parser.add_argument(
        "--nats-credentials",
        type=Path,
        metavar="FILE",
        help="file with the NATS user and password (`strictq cluster up` writes <data-dir>/nats/credentials)",
    )


def nats_settings(args: argparse.Namespace) -> Any:
    """The --cluster servers and login, or None after printing why not (one line)."""
    from cluster.connect import NatsSettings

    try:
        return NatsSettings.from_url_arg(args.cluster, args.nats_credentials)
    except Exception as exc:  # NatsUrlError, or an unusable credentials file (StartupError)
        print(f"strictq: --cluster: {exc}", file=sys.stderr)
        return None


def fail(message: str, code: int) -> int:
    print(f"strictq: {message}", file=sys.stderr, flush=True)
    return code


# ------------------------------------------------------------------------------------------------- up
def cmd_up(args: argparse.Namespace) -> int:
    from wirelog.files import StartupError

    from .cluster_up import UpOptions, run_up

    if not 1 <= args.nodes <= MAX_NODES:
        return fail(f"--nodes must be 1-{MAX_NODES}", 2)
    if not 1 <= args.partitions <= 256:
        return fail("--partitions must be 1-256", 2)
    if not 1 <= args.nats_servers <= MAX_NATS_SERVERS:
        return fail(f"--nats-servers must be 1-{MAX_NATS_SERVERS}", 2)
    if args.nats_servers < args.replicas:
        return fail(
            f"--replicas {args.replicas} needs at least {args.replicas} JetStream servers, not "
            f"--nats-servers {args.nats_servers}",
            2,
        )
    if not 0 <= args.port <= 65535:
        return fail("--port must be 0-65535", 2)
    if args.proxy_port is not None and not args.proxy:
        return fail("--proxy-port and --no-proxy exclude each other", 2)
    if args.proxy_port is not None and not 1 <= args.proxy_port <= 65525:
        return fail("--proxy-port must be 1-65525 (its admin port is --proxy-port + 10)", 2)
    options = UpOptions(
        data_dir=args.data_dir,
        nodes=args.nodes,
        replicas=args.replicas,
        partitions=args.partitions,
        host=args.host,
        port=args.port,
        proxy=args.proxy,
        proxy_port=args.proxy_port,
        nats_servers=args.nats_servers,
    )
    try:
        return run_up(options)
    except StartupError as exc:  # the data dir, its lock, a port, the nats-server binary: one line
        return fail(str(exc).replace("\r", " ").replace("\n", " "), 2)


# --------------------------------------------------------------------------------------------- urls
def cmd_urls(args: argparse.Namespace) -> int:
    from .cluster_view import recorded_nats_urls

    urls = recorded_nats_urls(args.data_dir)
    if urls is None:
        return fail(_no_cluster_in(args.data_dir), 1)
    print(",".join(urls))
    return 0


def _no_cluster_in(data_dir: Path) -> str:
    return (
        f"no cluster in {data_dir} (no JetStream servers recorded): start one with "
        f"`strictq cluster up --data-dir {data_dir}`"
    )


# --------------------------------------------------------------------------------- finding a cluster
def _settings(args: argparse.Namespace) -> tuple[Any, int]:
    """(NatsSettings, 0), or (None, exit code) after one line saying why not."""
    from cluster.connect import NatsSettings, read_credentials
    from wirelog.files import StartupError

    from .cluster_view import recorded_nats_urls

    if args.cluster is not None:
        if args.data_dir is not None:
            return None, fail("give --data-dir or --cluster, not both", 2)
        settings = nats_settings(args)
        return (settings, 0) if settings is not None else (None, 2)
    if args.nats_credentials is not None:
        return None, fail("--nats-credentials goes with --cluster", 2)
    data_dir = args.data_dir if args.data_dir is not None else DEFAULT_DATA_DIR
    urls = recorded_nats_urls(data_dir)
    if urls is None:
        return None, fail(_no_cluster_in(data_dir), 1)
    from cluster.connect import credentials_path

    try:
        user, password = read_credentials(credentials_path(data_dir))
    except StartupError as exc:
        return None, fail(str(exc), 1)
    return NatsSettings(tuple(urls), user, password), 0


async def _open(settings: Any, name: str) -> tuple[Any, Any]:
    """(nats client, layout); NoCluster when there is none on those servers."""
    from cluster.connect import connect
    from cluster.layout import read_layout, retrying

    nc = await connect(settings.urls, settings.user, settings.password, name=name, within=5.0)
    try:
        layout = await retrying(lambda: read_layout(nc.jetstream()), "the cluster's layout", within=10.0)
    except BaseException:
        await nc.close()
        raise
    if layout is None:
        await nc.close()
        raise NoCluster(f"no strictq cluster on {', '.join(settings.urls)} (no layout record)")
    return nc, layout


class NoCluster(Exception):
    """The NATS servers answer, but hold no strictq cluster."""


def _run(args: argparse.Namespace, main: Any) -> int:
    """Run `main(settings)` with NATS faults turned into one line, exit 1."""
    import nats.errors
    import nats.js.errors

    from cluster.connect import NatsUnavailable
    from cluster.layout import LayoutError

    settings, code = _settings(args)
    if settings is None:
        return code
    logging.getLogger("strictq.cluster").setLevel(logging.ERROR)  # the one line below says it all
    try:
        result: int = asyncio.run(main(settings))
        return result
    except (NatsUnavailable, NoCluster, LayoutError) as exc:
        return fail(str(exc), 1)
    except TimeoutError:
        return fail(f"JetStream at {', '.join(settings.urls)} did not answer in time", 1)
    except (nats.errors.Error, nats.js.errors.Error) as exc:  # e.g. 10008: a server restarting; try again
        return fail(f"JetStream at {', '.join(settings.urls)} cannot answer now: {exc}", 1)


# ------------------------------------------------------------------------------------------- status
def cmd_status(args: argparse.Namespace) -> int:
    from .cluster_view import read_view

    async def main(settings: Any) -> int:
        nc, layout = await _open(settings, "strictq-cluster-status")
        try:
            view = await read_view(nc.jetstream(), layout, settings.urls)
        finally:
            await nc.close()
        if args.json:
            print(json.dumps(view.to_json()))
        else:
            print(render_status(view))
        return 0

    return _run(args, main)


def render_status(view: Any) -> str:
    layout = view.layout
    lines = [
        f"cluster {layout.id}: {layout.partitions} partitions, {layout.replicas} replica"
        f"{'s' if layout.replicas != 1 else ''}, NATS {','.join(view.nats)}",
        "",
        _table(
            ["PARTITION", "OWNER", "EPOCH", "STATE", "LAST SEQ", "STANDBYS (lag)"],
            [
                [
                    str(p.partition),
                    p.owner or "-",
                    str(p.epoch) if p.epoch is not None else "-",
                    ("serving" if p.serving else "not served")
                    + (f", moving to {p.moving_to}" if p.moving_to else ""),
                    str(p.last_seq) if p.last_seq is not None else "?",
                    ", ".join(f"{s.node} ({'?' if s.lag is None else s.lag})" for s in p.standbys) or "-",
                ]
                for p in view.partitions
            ],
        ),
        "",
        _table(
            ["NODE", "PID", "URL", "STATE", "REGION/ZONE", "PARTITIONS SERVED"],
            [
                [
                    n.name,
                    str(n.pid),
                    n.url,
                    n.state,
                    "/".join(part for part in (n.region, n.zone) if part) or "-",
                    ",".join(str(p) for p in n.serving) or "-",
                ]
                for n in view.nodes
            ],
        )
        if view.nodes
        else "no queue server has a heartbeat",
    ]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


# --------------------------------------------------------------------------------------------- move
def cmd_move(args: argparse.Namespace) -> int:
    from cluster.names import check_node_name

    text = args.partition.removeprefix("p")
    if not text.isdigit():
        return fail(f"PARTITION {args.partition!r} is not a partition number (0, 1, ...)", 2)
    partition = int(text)
    if check_node_name(args.node):
        return fail(f"NODE: {check_node_name(args.node)}", 2)
    if not 0 < args.wait <= 3600:
        return fail("--wait must be more than 0 and at most 3600 seconds", 2)

    async def main(settings: Any) -> int:
        nc, layout = await _open(settings, "strictq-cluster-move")
        try:
            return await move(nc.jetstream(), layout, partition, args.node, args.wait)
        finally:
            await nc.close()

    return _run(args, main)


async def move(js: Any, layout: Any, partition: int, node: str, wait: float) -> int:
    import contextlib

    import orjson
    from nats.js.errors import KeyNotFoundError

    from cluster.master import move_key

    from .cluster_view import read_view

    if not 0 <= partition < layout.partitions:
        return fail(
            f"partition {partition} does not exist: this cluster has partitions 0-{layout.partitions - 1}", 2
        )
    view = await read_view(js, layout)
    target = view.node(node)
    if target is None or not target.alive:
        alive = ", ".join(n.name for n in view.alive) or "none"
        return fail(f"node {node} is not a live queue server of this cluster (alive: {alive})", 2)
    current = view.partitions[partition]
    owners = await js.key_value(layout.owners_bucket)
    if current.owner == node and current.serving:
        if current.moving_to is not None:  # a pending move elsewhere: this cancels it
            with contextlib.suppress(KeyNotFoundError):
                await owners.delete(move_key(partition))
        print(f"strictq: partition {partition} is already on {node} (epoch {current.epoch})", flush=True)
        return 0
    started = time.monotonic()
    await owners.put(move_key(partition), orjson.dumps({"node": node, "by": "operator"}))
    deadline = started + wait
    next_progress = started + PROGRESS_EVERY
    while True:
        await asyncio.sleep(MOVE_POLL)
        with contextlib.suppress(TimeoutError):  # a slow read: look again
            view = await read_view(js, layout)
        seen = view.partitions[partition]
        if seen.owner == node and seen.serving:
            took = time.monotonic() - started
            print(
                f"strictq: partition {partition} moved to {node} (epoch {seen.epoch}) in {took:.2f}s",
                flush=True,
            )
            return 0
        now = time.monotonic()
        if now >= deadline:
            return fail(
                f"partition {partition} did not move to {node} within {wait:g}s: "
                f"{_progress(view, partition, node)}"
                "; the request stays (`strictq cluster move` it to its owner to cancel)",
                1,
            )
        if now >= next_progress:
            next_progress = now + PROGRESS_EVERY
            print(
                f"strictq: partition {partition}: {_progress(view, partition, node)}",
                file=sys.stderr,
                flush=True,
            )


def _progress(view: Any, partition: int, node: str) -> str:
    seen = view.partitions[partition]
    owner = "no owner" if seen.owner is None else f"owner {seen.owner} (epoch {seen.epoch}"
    if seen.owner is not None:
        owner += ", serving)" if seen.serving else ", not serving)"
    target = view.node(node)
    if target is None or not target.alive:
        where = f"{node} has no heartbeat"
    else:
        applied = target.applied.get(partition)
        last = "?" if seen.last_seq is None else str(seen.last_seq)
        where = f"{node} applied {'nothing' if applied is None else applied} of {last}"
    return f"{owner}, {where}"
