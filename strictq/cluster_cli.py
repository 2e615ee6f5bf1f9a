"""`strictq cluster up | status | move | placement | plan | urls`: run a cluster on one machine, look at one,
move a partition, set where partitions should live and see (or make) the moves that would put them there.

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
MAX_PLAN_WAIT = 3600.0

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
    --nats-credentials DIR/nats/credentials --internal-secret DIR/internal.secret \\
    --node n4 --data-dir DIR/nodes/n4 --port 0
See docs/cluster.md for a layout over three machines."""

STATUS_EPILOG = """\
--json prints one object: {"cluster": {"id", "partitions", "replicas", "nats": [url...]}, "partitions":
[{"partition", "owner", "epoch", "serving", "last_seq", "moving_to", "standbys": [{"node", "applied",
"lag"}], "region" (the owner's), "traffic": null | {"rate" (msg/s), "regions": {region: msg/s},
"unknown" (msg/s from clients of no known region), "top_region", "top_share"}}], "nodes": [{"node", "pid",
"url", "state" ("alive" | "stale"), "age" (seconds since its last heartbeat), "serving": [partition...],
"region", "zone", "applied": {"partition": position}}], "edges": [{"edge", "region", "zone", "url", "age"
(seconds since its last report), "window", "sends_per_s", "nodes": {node: {"region", "rtt_ms"}},
"partitions": {"partition": {"rates", "sends", "p50_ms", "p99_ms", "owner"}}}], "placement": the policy
(`strictq cluster placement --json`)}. A standby's lag is the stream's last sequence minus the position it
has applied; rates are over each edge's window. Exit 1 when there is no cluster there."""

PLACEMENT_EPILOG = """\
Modes: off (the master only balances partitions over the nodes), traffic (a partition's owner moves to the
region its sends come from, when that region sends at least --min-share of them and the measured latency
saved is at least --min-saving-ms), schedule (every partition follows the schedule: at 08:00 of the day
the 08:00 step's region owns them; a compressed day with --day-seconds). Either way a partition moves only
after the same region was wanted for --hold seconds, not again within --cooldown seconds of its last move,
and the cluster makes at most --max-moves-per-hour moves. Changes keep the other settings. Exit 2 for a bad
value, 1 when there is no cluster. See docs/cluster.md, "Regions, edges and placement"."""

PLAN_EPILOG = """\
The proposals follow the placement policy's mode (or --by; traffic when the policy is off) as if made
now: --hold does not apply, the move budget and moves under way do. STATUS says "ready" or why not
yet. --apply writes the ready moves (the master carries them out like `strictq cluster move`), records
them in the placement history, and waits for them: one line per finished move; exit 0 when all finished,
1 when one did not within --wait (the requests stay). --json prints {"mode", "proposals": [{"partition",
"from_node", "to_node", "from_region", "to_region", "reason", "saved_ms", "risk", "blocked", "status"}]}."""


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
    from .health_cli import add_settings_arguments

    add_settings_arguments(up)  # handed to every queue server: the gates and the decider run there
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
    up.add_argument(
        "--regions",
        metavar="R1,R2,...",
        help="simulated geography: queue server nK (and JetStream server K) runs in region R[(K-1) mod "
        "count], zone <region>-1 (`strictq queue-server --region --zone`; the regions' names: 1-64 "
        "letters, digits, '_' or '-'). Default: no regions",
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

    placement = sub.add_parser(
        "placement",
        help="show or set the placement policy: off, by traffic, or a follow-the-sun schedule",
        description="Show the placement policy (no option), or change it: the options given change those "
        "settings, the others stay; the new policy is printed.",
        epilog=PLACEMENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = placement.add_mutually_exclusive_group()
    mode.add_argument("--off", dest="mode", action="store_const", const="off", help="placement off")
    mode.add_argument(
        "--traffic",
        dest="mode",
        action="store_const",
        const="traffic",
        help="move each partition toward the region its sends come from (measured by the edges)",
    )
    mode.add_argument(
        "--schedule",
        metavar="HH:MM=REGION,...",
        help="follow the sun: from each time of day on, partitions are owned in that step's region, "
        "e.g. 00:00=ap,08:00=eu,16:00=us (sets the mode to schedule)",
    )
    placement.add_argument(
        "--day-seconds",
        metavar="S",
        help="the length of the schedule's day: 86400 (the default) for a real one, less for a compressed "
        "day, which then starts now unless --day-origin says when",
    )
    placement.add_argument(
        "--day-origin",
        metavar="UNIX_TIME",
        help="when the schedule's day starts (default: 0, midnight UTC, for a real day; now for a "
        "compressed one)",
    )
    for flag, what in (
        ("--hold", "seconds the same region must be wanted before a partition moves (default: 300)"),
        ("--cooldown", "seconds after a partition's move before it moves again (default: 900)"),
        ("--max-moves-per-hour", "moves placement makes in any hour, at most (default: 12)"),
        ("--min-share", "traffic: the top region's least share (0-1) of a partition's sends (default: 0.5)"),
        ("--min-saving-ms", "traffic: the latency a move must save, in ms (default: 5)"),
        ("--min-rate", "traffic: partitions sending less (msg/s) are left where they are (default: 0.2)"),
    ):
        placement.add_argument(flag, metavar="N", help=what)
    placement.add_argument("--json", action="store_true", help="print the policy as one JSON object")
    _where_arguments(placement)
    placement.set_defaults(handler=cmd_placement)

    plan_parser = sub.add_parser(
        "plan",
        help="the moves placement would make now and why (latency saved, risk); --apply makes them",
        description="Show the partition moves the placement policy would make now: from which node and "
        "region to which, why, the latency saved, the risk, and whether they can be made now.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan_parser.add_argument("--apply", action="store_true", help="make the ready moves and wait for them")
    plan_parser.add_argument(
        "--by",
        choices=("traffic", "schedule"),
        help="plan by the measured traffic or by the schedule (default: the policy's mode; traffic when "
        "it is off)",
    )
    plan_parser.add_argument(
        "--wait",
        default="60",
        metavar="SECONDS",
        help="with --apply: give up waiting after this long (the requests stay; default: %(default)s)",
    )
    plan_parser.add_argument("--json", action="store_true", help="one JSON object (shape below)")
    _where_arguments(plan_parser)
    plan_parser.set_defaults(handler=cmd_plan)

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
    print("strictq: give a cluster command: up, status, move, placement, plan or urls", file=sys.stderr)
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
    regions = _regions(args.regions)
    if isinstance(regions, str):
        return fail(f"--regions: {regions}", 2)
    from .health_cli import settings_argv, settings_from_args

    try:
        settings_from_args(args)  # refused here, in one line, rather than by every node
    except ValueError as exc:
        return fail(str(exc), 2)
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
        regions=regions,
        health=tuple(settings_argv(args)),
    )
    try:
        return run_up(options)
    except StartupError as exc:  # the data dir, its lock, a port, the nats-server binary: one line
        return fail(str(exc).replace("\r", " ").replace("\n", " "), 2)


def _regions(text: str | None) -> tuple[str, ...] | str:
    """The --regions names, or what is wrong with them."""
    from cluster.names import check_node_name

    if text is None:
        return ()
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if problem := check_node_name(name, "region name"):
            return problem
    if len(set(names)) != len(names):
        return f"{text!r} names a region twice"
    return names


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
            view = await read_view(nc.jetstream(), layout, settings.urls, geo=True)
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
    geo = view.geo
    lines = [
        f"cluster {layout.id}: {layout.partitions} partitions, {layout.replicas} replica"
        f"{'s' if layout.replicas != 1 else ''}, NATS {','.join(view.nats)}",
        *([_policy_line(geo)] if geo is not None else []),
        "",
        _table(
            ["PARTITION", "OWNER", "REGION", "EPOCH", "STATE", "LAST SEQ", "STANDBYS (lag)", "SENDS FROM"],
            [
                [
                    str(p.partition),
                    p.owner or "-",
                    p.region or "-",
                    str(p.epoch) if p.epoch is not None else "-",
                    ("serving" if p.serving else "not served")
                    + (f", moving to {p.moving_to}" if p.moving_to else ""),
                    str(p.last_seq) if p.last_seq is not None else "?",
                    ", ".join(f"{s.node} ({'?' if s.lag is None else s.lag})" for s in p.standbys) or "-",
                    _sends_from(geo.traffic(p.partition) if geo is not None else None),
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
    if geo is not None:
        none = "no edge has reported (gateways report every second)"
        lines += ["", _edges_table(geo.edges) if geo.edges else none]
    return "\n".join(lines)


def _sends_from(traffic: Any) -> str:
    """The region sending most, its share and the total rate ("us 90% of 12.0/s"), or "-" for none."""
    if traffic is None or traffic.total <= 0:
        return "-"
    top = traffic.top
    if top is None:
        return f"unknown regions, {traffic.total:.1f}/s"
    return f"{top[0]} {top[1]:.0%} of {traffic.total:.1f}/s"


def _edges_table(edges: Any) -> str:
    return _table(
        ["EDGE", "REGION", "ZONE", "URL", "SENDS/S", "RTT TO NODES (ms)"],
        [
            [
                e.name,
                e.report.region or "-",
                e.report.zone or "-",
                e.report.url or "-",
                f"{e.sends_per_s:.1f}",
                ", ".join(f"{name} {n.rtt_ms:.0f}" for name, n in sorted(e.report.nodes.items())) or "-",
            ]
            for e in edges
        ],
    )


def _policy_line(geo: Any) -> str:
    if geo.policy is None:
        return f"placement: unknown ({geo.problem})"
    return describe_policy(geo.policy, geo.history, time.time())


def describe_policy(policy: Any, history: Any, now: float) -> str:
    """One line: the placement policy's mode and settings, and the moves it made in the last hour."""
    from cluster.placement import BUDGET_WINDOW, format_schedule

    limits = f"hold {policy.hold:g}s, cooldown {policy.cooldown:g}s, "
    limits += f"at most {policy.max_moves_per_hour} moves/hour"
    if policy.mode == "off":
        head = "placement: off (the master only balances partitions over the nodes)"
    elif policy.mode == "traffic":
        head = (
            f"placement: by traffic (a region sending >= {policy.min_share:.0%} of >= {policy.min_rate:g} "
            f"msg/s, saving >= {policy.min_saving_ms:g} ms), {limits}"
        )
    else:
        day = "a 24h day" if policy.day_seconds == 86400.0 else f"a {policy.day_seconds:g}s day"
        head = (
            f"placement: by schedule {format_schedule(policy.schedule)} over {day} (now "
            f"{policy.scheduled_region(now)}), {limits}"
        )
    recent = sum(1 for record in history if record.at > now - BUDGET_WINDOW)
    return f"{head}; {recent} move{'s' if recent != 1 else ''} in the last hour"


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
    left, view = await wait_moves(js, layout, view, {partition: node}, started, wait)
    if not left:
        return 0
    return fail(
        f"partition {partition} did not move to {node} within {wait:g}s: {_progress(view, partition, node)}"
        "; the request stays (`strictq cluster move` it to its owner to cancel)",
        1,
    )


async def wait_moves(
    js: Any,
    layout: Any,
    view: Any,
    targets: dict[int, str],
    started: float,
    wait: float,
    out: Any = None,
) -> tuple[dict[int, str], Any]:
    """Until each partition of `targets` is served by its target node, or `wait` seconds after `started`
    (time.monotonic()): one line on `out` (stdout) per finished move, a progress line on stderr every
    second per unfinished one. Returns the unfinished moves and the last view."""
    import contextlib

    from .cluster_view import read_view

    left = dict(targets)
    deadline = started + wait
    next_progress = started + PROGRESS_EVERY
    while left:
        await asyncio.sleep(MOVE_POLL)
        with contextlib.suppress(TimeoutError):  # a slow read: look again
            view = await read_view(js, layout)
        for partition, node in sorted(left.items()):
            seen = view.partitions[partition]
            if seen.owner == node and seen.serving:
                took = time.monotonic() - started
                print(
                    f"strictq: partition {partition} moved to {node} (epoch {seen.epoch}) in {took:.2f}s",
                    file=out or sys.stdout,
                    flush=True,
                )
                del left[partition]
        now = time.monotonic()
        if not left or now >= deadline:
            break
        if now >= next_progress:
            next_progress = now + PROGRESS_EVERY
            for partition, node in sorted(left.items()):
                print(
                    f"strictq: partition {partition}: {_progress(view, partition, node)}",
                    file=sys.stderr,
                    flush=True,
                )
    return left, view


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


# ---------------------------------------------------------------------------------------- placement
# The numeric options of `cluster placement`: (flag, policy field, lowest, highest, whole number).
POLICY_NUMBERS: tuple[tuple[str, str, float, float, bool], ...] = (
    ("--day-seconds", "day_seconds", 1.0, 10 * 86400.0, False),
    ("--day-origin", "day_origin", 0.0, 1e11, False),
    ("--hold", "hold", 0.0, 86400.0, False),
    ("--cooldown", "cooldown", 0.0, 86400.0, False),
    ("--max-moves-per-hour", "max_moves_per_hour", 0, 10_000, True),
    ("--min-share", "min_share", 0.0, 1.0, False),
    ("--min-saving-ms", "min_saving_ms", 0.0, 60_000.0, False),
    ("--min-rate", "min_rate", 0.0, 1e9, False),
)


def parse_number(text: str, flag: str, low: float, high: float, whole: bool = False) -> float | int | str:
    """`text` as a number within low-high (a whole one with `whole`), or the one line saying what is
    wrong (argparse's own would add a usage line)."""
    import math

    try:
        value = int(text) if whole else float(text)
    except ValueError:
        return f"{flag}: {text!r} is not a {'whole number' if whole else 'number'}"
    if not math.isfinite(value) or not low <= value <= high:
        return f"{flag} must be {low:g}-{high:g}, not {text}"
    return value


def cmd_placement(args: argparse.Namespace) -> int:
    from cluster.placement import PlacementPolicy, PolicyError, parse_schedule

    changes: dict[str, Any] = {}
    for flag, name, low, high, whole in POLICY_NUMBERS:
        text = getattr(args, name)
        if text is None:
            continue
        value = parse_number(text, flag, low, high, whole)
        if isinstance(value, str):
            return fail(value, 2)
        changes[name] = value
    if args.mode is not None:
        changes["mode"] = args.mode
    if args.schedule is not None:
        try:
            changes["schedule"] = parse_schedule(args.schedule)
        except PolicyError as exc:
            return fail(f"--schedule: {exc}", 2)
        changes["mode"] = "schedule"
    if "day_seconds" in changes and "day_origin" not in changes:
        # A compressed day starts now; a real one at midnight UTC.
        changes["day_origin"] = 0.0 if changes["day_seconds"] == 86400.0 else float(int(time.time()))

    async def main(settings: Any) -> int:
        from dataclasses import replace

        from cluster.placement_store import read_placement, write_policy

        nc, layout = await _open(settings, "strictq-cluster-placement")
        try:
            js = nc.jetstream()
            try:
                policy, history = await read_placement(js, layout)
            except PolicyError as exc:  # another version's record: only a change can replace it
                if not changes:
                    return fail(f"the placement policy cannot be read: {exc}", 1)
                policy, history = PlacementPolicy(), ()
            if changes:
                try:
                    policy = replace(policy, **changes)
                except PolicyError as exc:  # e.g. --traffic kept, --schedule never given: mode schedule
                    return fail(f"placement: {exc}", 2)
                await write_policy(js, layout, policy)
        finally:
            await nc.close()
        if args.json:
            print(json.dumps(policy.to_dict()))
        else:
            print(describe_policy(policy, history, time.time()))
        return 0

    return _run(args, main)


# --------------------------------------------------------------------------------------------- plan
def cmd_plan(args: argparse.Namespace) -> int:
    wait = parse_number(args.wait, "--wait", 0.0, MAX_PLAN_WAIT)
    if isinstance(wait, str):
        return fail(wait, 2)
    if wait <= 0:
        return fail(f"--wait must be more than 0 and at most {MAX_PLAN_WAIT:g} seconds", 2)

    async def main(settings: Any) -> int:
        from .cluster_view import read_view

        nc, layout = await _open(settings, "strictq-cluster-plan")
        try:
            js = nc.jetstream()
            view = await read_view(js, layout, settings.urls, geo=True)
            return await plan(js, layout, view, args.by, args.apply, float(wait), args.json)
        finally:
            await nc.close()

    return _run(args, main)


async def plan(
    js: Any, layout: Any, view: Any, by: str | None, apply: bool, wait: float, as_json: bool
) -> int:
    """`strictq cluster plan`: the placement proposals for now (hold waived: an operator asked), and with
    `apply` the ready ones written as planned moves, recorded, and waited for."""
    from dataclasses import replace

    import orjson
    from nats.js.errors import KeyWrongLastSequenceError

    from cluster import traffic
    from cluster.master import move_key
    from cluster.placement import MoveRecord, PlacementState, propose
    from cluster.placement_store import record_moves

    geo = view.geo
    policy = geo.policy
    if policy is None:
        return fail(f"the placement policy cannot be read: {geo.problem}", 1)
    mode = by or (policy.mode if policy.mode != "off" else "traffic")
    if mode == "schedule" and not policy.schedule:
        return fail(
            "no schedule to plan by: set one with `strictq cluster placement --schedule 00:00=ap,...`", 2
        )
    if mode == "traffic" and not geo.edges:
        note = "no traffic measured yet: edges report every second"
        print(json.dumps({"mode": mode, "proposals": [], "note": note}) if as_json else f"strictq: {note}")
        return 0
    now = time.time()
    demand = traffic.demand(geo.reports)
    proposals, _ = propose(
        partitions=layout.partitions,
        assignments=view.assignments,
        nodes=view.live_infos(),
        demand=demand,
        latency=traffic.latency(geo.reports),
        policy=replace(policy, hold=0.0),
        state=PlacementState({}, geo.history),
        now=now,
        pending_moves={p.partition: p.moving_to for p in view.partitions if p.moving_to is not None},
        mode="schedule" if mode == "schedule" else "traffic",
    )
    status = {p.partition: p.blocked or ("moving" if apply else "ready") for p in proposals}
    targets: dict[int, str] = {}
    if apply:
        owners = await js.key_value(layout.owners_bucket)
        ready = [p for p in proposals if not p.blocked and p.to_node]
        # Recorded before they are asked for: the budget and the cooldown (the master's too) count a move
        # that a failure below left unasked, never one asked for and not counted.
        if ready:
            await record_moves(js, layout, [MoveRecord.of(p, now, "plan") for p in ready])
        for proposal in ready:
            request = {"node": proposal.to_node, "by": "plan", "why": proposal.reason}
            try:
                await owners.create(move_key(proposal.partition), orjson.dumps(request))
            except KeyWrongLastSequenceError:  # someone asked for a move of it since the view was read
                status[proposal.partition] = "a move is under way"
                continue
            except Exception:
                if targets:
                    asked = ", ".join(f"partition {p} to {n}" for p, n in sorted(targets.items()))
                    print(f"strictq: asked for before the failure: {asked}", file=sys.stderr, flush=True)
                raise
            targets[proposal.partition] = proposal.to_node
    if as_json and not apply:
        print(json.dumps({"mode": mode, "proposals": [_proposal_json(p, status) for p in proposals]}))
        return 0
    if not as_json:
        print(_plan_text(mode, len(geo.edges), bool(demand), proposals, status), flush=True)
    left: dict[int, str] = {}
    if targets:
        out = sys.stderr if as_json else sys.stdout  # stdout stays one JSON object
        left, view = await wait_moves(js, layout, view, targets, time.monotonic(), wait, out)
        for partition in targets:
            status[partition] = "not moved yet" if partition in left else "moved"
    if as_json:
        print(json.dumps({"mode": mode, "proposals": [_proposal_json(p, status) for p in proposals]}))
    if left:
        return fail(
            f"{len(left)} of {len(targets)} moves did not finish within {wait:g}s: "
            + "; ".join(f"partition {p}: {_progress(view, p, node)}" for p, node in sorted(left.items()))
            + "; the requests stay",
            1,
        )
    return 0


def _plan_text(mode: str, edges: int, demand: bool, proposals: list[Any], status: dict[int, str]) -> str:
    if not proposals:
        if mode == "schedule":
            return "strictq: no moves: every partition is owned in the schedule's region of now"
        if not demand:
            return (
                f"strictq: no moves: {edges} edge{'s' if edges != 1 else ''} reported, but no sends from "
                "a known client region"
            )
        return "strictq: no moves: every partition with traffic is owned where its senders are served best"
    return _table(
        ["PARTITION", "FROM", "TO", "WHY", "SAVED", "RISK", "STATUS"],
        [
            [
                str(p.partition),
                f"{p.from_node} ({p.from_region or '?'})",
                f"{p.to_node or '-'} ({p.to_region})",
                p.reason,
                "-" if p.saved_ms is None else f"{p.saved_ms:.0f} ms",
                p.risk or "-",
                status[p.partition],
            ]
            for p in proposals
        ],
    )


def _proposal_json(proposal: Any, status: dict[int, str]) -> dict[str, Any]:
    return {
        "partition": proposal.partition,
        "from_node": proposal.from_node,
        "to_node": proposal.to_node or None,
        "from_region": proposal.from_region or None,
        "to_region": proposal.to_region,
        "reason": proposal.reason,
        "saved_ms": None if proposal.saved_ms is None else round(proposal.saved_ms, 3),
        "risk": proposal.risk,
        "blocked": proposal.blocked,
        "status": status[proposal.partition],
    }
