"""The `strictq` command. Subcommands import their packages lazily, so a client command starts fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

INIT_HELP = (
    "start with an empty store although the data dir shows an earlier one (a marker, development keys, "
    "fences, wire-log segments) whose store file is missing or empty; without it such a start is refused, "
    "as its messages would be gone. A new data dir needs no --init"
)
CLIENT_ENV_HELP = (
    "Client commands (send, poll, ack, peek, size, queues) talk to `strictq serve` at STRICTQ_URL "
    "(default https://127.0.0.1:8443), trusting the CA in STRICTQ_CA_FILE, each with the key of the role "
    "it needs: send STRICTQ_API_KEY (a producer), poll and ack STRICTQ_WORKER_SECRET (a worker), peek and "
    "size STRICTQ_ADMIN_KEY (an admin); queues signs SQS ListQueues with AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY. `strictq serve` writes all of them to <data-dir>/client.env: load it with "
    "`set -a; . var/strictq/client.env; set +a` (make run's data dir). With --queue-server URL or "
    "STRICTQ_QUEUE_URL they talk to a `strictq queue-server`'s internal API instead (the flag wins over "
    "STRICTQ_QUEUE_URL, which wins over STRICTQ_URL), with STRICTQ_API_KEY and STRICTQ_WORKER_ID. "
    "STRICTQ_REGION, when set, is sent to the gateway as X-Strictq-Region (an edge of a cluster)."
)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    # `strictq search` is a whole process per lookup: build only the wire-log commands' parser, so it
    # imports none of the server's command modules (asyncio, aiohttp clients: ~100 ms of a ~200 ms run).
    if _command_of(args_list) == "search":
        if argv is None:
            # This process is the command (not a caller of main()): pyarrow imports numpy when it is
            # installed (~90 ms) although the lookup uses none of it (Arrow to Python lists only; numpy is
            # optional to pyarrow). A None entry makes `import numpy` fail, so pyarrow goes without.
            sys.modules.setdefault("numpy", None)  # type: ignore[arg-type]
        parser = _wirelog_index_parser()
    else:
        parser = build_parser()
    if _command_of(args_list) == "send":
        # Bodies may follow options (`send q --group g BODY BODY`), which plain parse_args refuses.
        args, extra = parser.parse_known_args(args_list)
        if extra:
            if getattr(args, "handler", None) is cmd_send and not any(e.startswith("--") for e in extra):
                args.bodies = [*args.bodies, *extra]
            else:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
    else:
        args = parser.parse_args(args_list)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def _wirelog_index_parser() -> argparse.ArgumentParser:
    """`strictq index / search / errors` alone (spark.cli, stdlib imports only): the same sub-parsers
    `build_parser` mounts, so usage, help and errors read the same."""
    from spark.cli import register as register_spark

    parser = StrictqParser(prog="strictq")
    register_spark(parser.add_subparsers(title="commands", metavar="COMMAND"))
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand's name: the first word not an option (the top level's options take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


class StrictqParser(argparse.ArgumentParser):
    """Every `strictq` parser, sub-parsers included (add_subparsers makes them of this class): long
    options must be spelled out (`--mod` is not `--mode`), so a typo is an error, not a guess."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("strictq")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    # The command modules are imported here, not at the top: `strictq search` never builds this parser.
    from fencing.cli import register as register_proxy_commands

    from .admin_cli import register as register_admin_commands
    from .cluster_cli import add_nats_arguments
    from .cluster_cli import register as register_cluster_commands
    from .estimates_cli import register_estimates
    from .fleet_cli import add_settings_arguments as add_fleet_arguments
    from .fleet_cli import register as register_fleet_commands
    from .handover_cli import register as register_handover_commands
    from .health_cli import add_settings_arguments as add_health_arguments
    from .health_cli import register as register_health_commands
    from .limits_cli import register as register_limits_commands
    from .limits_cli import register_protections
    from .rollout_cli import register as register_rollout_commands

    parser = StrictqParser(
        prog="strictq",
        description="A strict queue with failure management: per-group order, fencing tokens, durable store.",
        epilog=CLIENT_ENV_HELP,
    )
    parser.add_argument("--version", action="version", version=f"strictq {version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    server = commands.add_parser(
        "queue-server",
        help="run the queue core behind its internal HTTP API",
        description="Run the queue core behind its internal HTTP API (loopback by default). Prints "
        "'strictq: listening on <url>' once it accepts connections; stops cleanly on SIGTERM.",
    )
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    server.add_argument(
        "--port", type=int, default=8470, help="port; 0 picks a free one (default: %(default)s)"
    )
    server.add_argument(
        "--data-dir", type=Path, default=Path("var/queue"), help="store directory (default: %(default)s)"
    )
    server.add_argument(
        "--partitions",
        type=int,
        default=64,
        help="hash partitions, fixed per deployment (default: %(default)s)",
    )
    server.add_argument(
        "--keys",
        type=Path,
        help="credential file for the admin routes (control stream, fences; default: <data-dir>/keys.toml, "
        "created with development keys)",
    )
    server.add_argument("--init", action="store_true", help=INIT_HELP)
    server.add_argument(
        "--internal-secret",
        type=Path,
        metavar="FILE",
        help="the internal API's shared secret (0600; every request but /healthz and /readyz must carry it; "
        "default: $STRICTQ_INTERNAL_SECRET_FILE, else <data-dir>/internal.secret, created when missing; a "
        "cluster's nodes and edges share one: `strictq cluster up` writes DIR/internal.secret)",
    )
    server.add_argument(
        "--tls-cert",
        type=Path,
        help="serve the internal API over TLS with this certificate chain (PEM): beyond loopback the "
        'internal secret must not travel in clear (docs/cluster.md, "Internal traffic")',
    )
    server.add_argument("--tls-key", type=Path, help="private key (PEM) for --tls-cert")
    cluster_options = server.add_argument_group(
        "cluster", "run as one queue server of a cluster replicated on NATS JetStream (docs/cluster.md)"
    )
    add_nats_arguments(cluster_options)
    cluster_options.add_argument(
        "--node", metavar="NAME", help="this queue server's name in the cluster (default: the host name)"
    )
    cluster_options.add_argument(
        "--advertise",
        metavar="URL",
        help="the URL gateways reach this queue server at, when it is not the bound address (e.g. with "
        "--host 0.0.0.0: http://this-host:8470)",
    )
    for flag, what in (("--region", "region"), ("--zone", "zone within the region")):
        cluster_options.add_argument(
            flag,
            default="",
            metavar="NAME",
            help=f"the {what} this queue server runs in, shown by `strictq cluster status` (1-64 letters, "
            "digits, '_' or '-')",
        )
    cluster_options.add_argument(
        "--cluster-partitions",
        type=int,
        default=3,
        metavar="N",
        help="partitions of a new cluster (the unit of ownership; ignored once the cluster exists; "
        "default: %(default)s)",
    )
    cluster_options.add_argument(
        "--replicas",
        type=int,
        choices=(1, 3),
        default=3,
        help="JetStream replicas of a new cluster's streams (default: %(default)s)",
    )
    add_health_arguments(server)
    add_fleet_arguments(server)
    add_connection_arguments(server)
    server.set_defaults(handler=cmd_queue_server)

    serve = commands.add_parser(
        "serve",
        help="run the embedded default: HTTPS gateway (SQS JSON + EmoDB REST) with the queue core in-process",
        description="Run the edge gateway with the queue core in-process. On first start it creates a local "
        "CA and server certificate (<data-dir>/tls) and development credentials (<data-dir>/keys.toml), "
        "and writes the client environment to <data-dir>/client.env. Starts the egress proxy for workers "
        "(`strictq proxy`) as a child process following this process's control stream, its wire log in "
        "<data-dir>/wirelog. Prints 'strictq: listening on <url>', then the ca and keys paths, "
        "'strictq: proxy on <url>', 'strictq: proxy ca <path>' and the client env path; stops cleanly on "
        "SIGTERM.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument(
        "--port", type=int, default=8443, help="port; 0 picks a free one (default: %(default)s)"
    )
    serve.add_argument(
        "--data-dir", type=Path, default=Path("var/strictq"), help="state directory (default: %(default)s)"
    )
    serve.add_argument(
        "--partitions",
        type=int,
        default=64,
        help="hash partitions, fixed per deployment (default: %(default)s)",
    )
    serve.add_argument(
        "--keys",
        type=Path,
        help="credential file (TOML; default: <data-dir>/keys.toml, created with development keys)",
    )
    serve.add_argument(
        "--tls-cert", type=Path, help="server certificate chain (PEM) instead of the local CA's"
    )
    serve.add_argument("--tls-key", type=Path, help="private key (PEM) for --tls-cert")
    serve.add_argument(
        "--queue-server",
        metavar="URL",
        help="forward to a separate `strictq queue-server` at URL (its internal API) instead of running the "
        "queue core in this process",
    )
    serve.add_argument(
        "--internal-secret",
        type=Path,
        metavar="FILE",
        help="with --queue-server or --cluster: the queue servers' internal secret, sent on every call "
        "(default: $STRICTQ_INTERNAL_SECRET_FILE; the queue server prints its file as "
        "'strictq: internal secret <path>')",
    )
    serve.add_argument(
        "--internal-ca",
        type=Path,
        metavar="PEM",
        help="with --queue-server or --cluster: the CA that signed the queue servers' --tls-cert (their "
        "https:// URLs; default: the system's CAs)",
    )
    serve.add_argument(
        "--index", type=Path, help="wire-log index served at GET /admin/v1/search (default: <data-dir>/index)"
    )
    serve.add_argument("--client-ca", type=Path, help="require client certificates signed by this CA (PEM)")
    serve.add_argument(
        "--insecure-http", action="store_true", help="serve plain HTTP (no TLS): development only"
    )
    serve.add_argument(
        "--no-proxy",
        dest="proxy",
        action="store_false",
        help="do not start the egress proxy (`strictq proxy`) as a child process",
    )
    serve.add_argument(
        "--proxy-port",
        type=int,
        help="egress proxy port (default: 8480, or a free one with --port 0); its admin port is this + 10",
    )
    serve.add_argument(
        "--upstream-ca",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="extra CA (PEM) the egress proxy trusts for upstream certificates, besides the system roots "
        "(a private HTTPS backend; repeatable)",
    )
    serve.add_argument("--init", action="store_true", help=INIT_HELP)
    serve_cluster = serve.add_argument_group(
        "cluster",
        "be the gateway of a cluster (docs/cluster.md): route each group to its partition's owner instead "
        "of running the queue core (excludes --queue-server and --init)",
    )
    add_nats_arguments(serve_cluster)
    add_edge_arguments(serve_cluster)
    serve.add_argument(
        "--region",
        dest="regions",
        action="append",
        default=[],
        metavar="REGION",
        help="SQS: a region requests may be signed for (repeatable); others are refused as SQS refuses "
        "them. Default: any region (queues are the same in every region; ARNs carry the caller's). With "
        "--cluster the first --region is also this edge's region: its clients' region unless "
        "--client-regions, --trusted-proxy or --trust-region-header say otherwise",
    )
    serve.add_argument(
        "--tenant-rate",
        type=float,
        metavar="MSGS_PER_S",
        help="every tenant's default send limit, messages per second (a token bucket per tenant; sends over "
        "it get 429 + Retry-After on the EmoDB face, RequestThrottled on the SQS face). Default: unlimited. "
        "`strictq limits set` gives a tenant its own at run time",
    )
    serve.add_argument(
        "--tenant-burst",
        type=float,
        metavar="MSGS",
        help="with --tenant-rate: messages a tenant may send at once after a quiet spell (default: the rate)",
    )
    add_health_arguments(serve)
    add_fleet_arguments(serve)
    add_connection_arguments(serve)
    serve.set_defaults(handler=cmd_serve)

    send = commands.add_parser(
        "send",
        help="send messages",
        description="Send one message per BODY "
        "(or one per line of standard input when BODY is '-'). " + CLIENT_ENV_HELP,
    )
    send.add_argument("queue")
    send.add_argument(
        "bodies",
        nargs="*",
        metavar="BODY",
        help="message body (text: through the gateway a JSON string, see --json); '-' reads lines from stdin",
    )
    send.add_argument(
        "--group",
        help="strict order parameter: same-group messages are delivered in order, one claim at a time",
    )
    send.add_argument(
        "--json",
        action="store_true",
        help="bodies are JSON values (validated, stored as application/json; the EmoDB face's payloads)",
    )
    send.add_argument(
        "--dedup-id",
        help="deduplication id (duplicates within the queue's window are dropped; queue server only)",
    )
    send.add_argument(
        "--id",
        dest="message_id",
        help="message id to use (default: assigned by the queue; queue server only)",
    )
    send.add_argument(
        "--delay", type=float, help="seconds before the message can be received (0-900; queue server only)"
    )
    add_queue_server_argument(send)
    send.set_defaults(handler=cmd_send)

    poll = commands.add_parser(
        "poll",
        help="claim messages",
        description="Claim up to LIMIT messages for TTL "
        "seconds and print them, one JSON object per line. " + CLIENT_ENV_HELP,
    )
    poll.add_argument("queue")
    poll.add_argument(
        "--limit", type=int, default=10, help="at most this many messages (1-1000, default %(default)s)"
    )
    poll.add_argument(
        "--ttl", type=float, help="claim duration in seconds (default: the queue's visibility timeout)"
    )
    poll.add_argument("--wait", type=float, default=0.0, help="long-poll up to this many seconds (max 20)")
    poll.add_argument(
        "--worker",
        help="queue server only: worker id recorded with the claim (default: $STRICTQ_WORKER_ID); through "
        "the gateway the claim goes to the key's credential",
    )
    add_queue_server_argument(poll)
    poll.set_defaults(handler=cmd_poll)

    ack = commands.add_parser(
        "ack",
        help="acknowledge (delete) claimed messages",
        description="Delete messages by receipt handle (refused if the claim was "
        "superseded), or by --id (EmoDB semantics: without --token the gateway answers success whatever "
        "happened to each id, printed as 'accepted'). " + CLIENT_ENV_HELP,
    )
    ack.add_argument("queue")
    ack.add_argument(
        "receipts",
        nargs="*",
        metavar="RECEIPT",
        help="receipt handles printed by 'poll'; '-' reads them from stdin, one per line or poll's JSON "
        "lines (`strictq poll q | strictq ack q -`)",
    )
    ack.add_argument("--id", dest="ids", action="append", default=[], help="message id (repeatable)")
    ack.add_argument("--token", type=int, help="with --id: fencing token; a stale one is refused")
    add_queue_server_argument(ack)
    ack.set_defaults(handler=cmd_ack)

    peek = commands.add_parser(
        "peek",
        help="show messages without claiming them",
        description="Print the queue's first messages, one JSON object per line, without claiming them. "
        + CLIENT_ENV_HELP,
    )
    peek.add_argument("queue")
    peek.add_argument("--limit", type=int, default=10, help="at most this many (1-1000, default %(default)s)")
    add_queue_server_argument(peek)
    peek.set_defaults(handler=cmd_peek)

    size = commands.add_parser(
        "size",
        help="count messages and claims in a queue",
        description="Print the queue's message count and how many are claimed (in flight), as JSON. "
        + CLIENT_ENV_HELP,
    )
    size.add_argument("queue")
    add_queue_server_argument(size)
    size.set_defaults(handler=cmd_size)

    queues = commands.add_parser(
        "queues", help="list queues", description="Print the queue names, one per line. " + CLIENT_ENV_HELP
    )
    queues.add_argument("--prefix", default="", help="only names starting with this")
    queues.add_argument("--json", action="store_true", help="one JSON string per line")
    add_queue_server_argument(queues)
    queues.set_defaults(handler=cmd_queues)
    register_proxy_commands(commands)  # strictq proxy / proxy ca (fencing.cli)
    register_admin_commands(commands)  # strictq fence / unfence / fences
    register_limits_commands(commands)  # strictq limits [list|set|clear]
    register_protections(commands)  # strictq protections QUEUE
    register_rollout_commands(commands)  # strictq routing QUEUE, strictq rollout {start,status,revert}
    register_estimates(commands)  # strictq estimates QUEUE (pipelining)
    register_health_commands(commands)  # strictq status / suspend / resume / unblacklist
    register_handover_commands(commands)  # strictq handover QUEUE --from W / --release G
    register_fleet_commands(commands)  # strictq fleet / control / fleet-policy
    register_cluster_commands(commands)  # strictq cluster up / status / move / urls
    from wirelog.cli import register as register_wirelog  # strictq wirelog tail / grep (stdlib imports only)

    register_wirelog(commands)
    from fencing.replay.cli import register as register_replay  # strictq replay (heavy imports when run)
    from strictq.replay_stack import run_isolated  # the isolated stack each replay run composes

    register_replay(commands, run_isolated)
    from spark.cli import register as register_spark  # strictq index / search / errors (stdlib imports only)

    register_spark(commands)
    _plugin_commands(commands)  # strictq demo (scenarios.demo: the failover scenario, narrated)
    return parser


def add_edge_arguments(group: argparse._ActionsContainer) -> None:
    """`strictq serve`'s flags of an edge of a cluster (issue 16: gateway.client_region, cluster.traffic)."""
    group.add_argument(
        "--zone", default="", metavar="NAME", help="the zone within its region this edge runs in"
    )
    group.add_argument(
        "--edge-name",
        metavar="NAME",
        help="this edge's name in the cluster's reports, unique among the cluster's edges (default: "
        "edge-<first --region, or any>-<host name>-<port>; 1-64 letters, digits, '_' or '-')",
    )
    group.add_argument(
        "--client-regions",
        type=Path,
        metavar="FILE",
        help='TOML table of client networks and their regions: lines like "10.1.0.0/16" = "eu" under '
        "[regions]; the longest matching prefix wins",
    )
    group.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="CIDR",
        help="a front proxy whose X-Forwarded-For is believed (repeatable): the right-most forwarded "
        "address that is not a trusted proxy is the client's, looked up in --client-regions",
    )
    group.add_argument(
        "--trust-region-header",
        action="store_true",
        help="take a client's X-Strictq-Region (the SDK's STRICTQ_REGION) as its region, for placement "
        "too (tests, or clients you run yourself); without it the header only orders that worker's polls",
    )
    group.add_argument(
        "--reach",
        action="append",
        default=[],
        metavar="NODE=URL",
        help="reach queue server NODE at URL from this edge instead of its advertised URL (NAT, a private "
        "link, a simulated WAN relay; repeatable)",
    )
    group.add_argument(
        "--traffic-window",
        type=float,
        metavar="SECONDS",
        help="the window of the send rates this edge reports for placement (default: 60)",
    )


EDGE_FLAGS = (  # (attribute, flag): given without --cluster, refused
    ("zone", "--zone"),
    ("edge_name", "--edge-name"),
    ("client_regions", "--client-regions"),
    ("trusted_proxy", "--trusted-proxy"),
    ("trust_region_header", "--trust-region-header"),
    ("reach", "--reach"),
    ("traffic_window", "--traffic-window"),
)


def _given(value: object) -> bool:
    """Whether a flag was given: not its default (None, "", [], False; a 0 is given)."""
    return value is not None and value is not False and value != "" and value != []


def edge_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """ServeOptions' edge fields from the flags (with --cluster), or None after one line saying what is
    wrong with which flag."""
    from cluster.names import check_node_name
    from gateway.client_region import RegionTableError, load_table, parse_network

    def bad(flag: str, problem: str) -> None:
        print(f"strictq: {flag}: {' '.join(problem.split())}", file=sys.stderr)

    names = (("--zone", args.zone, "zone"), ("--edge-name", args.edge_name, "name for an edge"))
    for flag, value, what in names:
        if value and (problem := check_node_name(value, what)):
            bad(flag, problem)
            return None
    if args.edge_name is not None and not args.edge_name:
        bad("--edge-name", "'' is not an edge name: 1-64 letters, digits, '_' or '-'")
        return None
    proxies = []
    for text in args.trusted_proxy:
        try:
            proxies.append(parse_network(text))
        except ValueError as exc:
            bad("--trusted-proxy", str(exc))
            return None
    table: list[Any] = []
    if args.client_regions is not None:
        try:
            table = load_table(args.client_regions)
        except RegionTableError as exc:
            bad("--client-regions", str(exc))
            return None
    reach: dict[str, str] = {}
    for text in args.reach:
        node, equals, url = text.partition("=")
        if not equals or not url:
            bad("--reach", f"{text!r} is not NODE=URL (e.g. eu=http://10.0.0.5:8470)")
            return None
        if problem := check_node_name(node):
            bad("--reach", problem)
            return None
        if not url.startswith(("http://", "https://")):
            bad("--reach", f"{text!r}: the URL must be http:// or https://")
            return None
        if node in reach:
            bad("--reach", f"{text!r}: node {node!r} is given twice")
            return None
        reach[node] = url.rstrip("/")
    window = 60.0 if args.traffic_window is None else args.traffic_window
    if not 1.0 <= window <= 86400.0:  # NaN too
        bad("--traffic-window", f"{window:g} is not 1-86400 seconds")
        return None
    return {
        "edge_region": args.regions[0] if args.regions else "",
        "zone": args.zone,
        "edge_name": args.edge_name,
        "client_regions": tuple(table),
        "trusted_proxies": tuple(proxies),
        "trust_region_header": args.trust_region_header,
        "reach": tuple(reach.items()),
        "traffic_window": window,
    }


PLUGIN_GROUP = "strictq.commands"


def _plugin_commands(commands: Any) -> None:
    """Add the subcommands that packages above strictq declare in the `strictq.commands` entry-point group
    (pyproject.toml: `demo = "scenarios.demo:register"`): found by name, so strictq never imports them
    and stays the lower layer. One that cannot load is left out with one line on stderr, not a traceback
    that would take every other command down with it."""
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            entry.load()(commands)
        except Exception as exc:
            print(f"strictq: command {entry.name!r} ({entry.value}) is unavailable: {exc}", file=sys.stderr)


# ------------------------------------------------------------------------------------------ server
def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="close a connection whose request head (or TLS handshake) is not complete within this time "
        "(default: %(default)s)",
    )


def _connection_limits(args: argparse.Namespace) -> Any:
    """queue_core.http_guard.ConnectionLimits from the flags, or None (after a message) if they are bad."""
    from queue_core.http_guard import ConnectionLimits

    if not 0 < args.header_timeout <= 3600:
        print("strictq: --header-timeout must be more than 0 and at most 3600 seconds", file=sys.stderr)
        return None
    return ConnectionLimits(header_timeout=args.header_timeout)


def run_server(start: Callable[[], None]) -> int:
    """Run a server; the one place start-up faults are rendered: one line on stderr naming the file and
    what to do, exit code 2, no traceback (wirelog.files.StartupError; the key file's KeyFileError)."""
    from access.keys import KeyFileError
    from wirelog.files import StartupError

    try:
        start()
    except (StartupError, KeyFileError) as exc:
        message = str(exc).replace("\r", " ").replace("\n", " ")  # one line, whatever it quotes
        print(f"strictq: {message}", file=sys.stderr, flush=True)
        return 2
    return 0


def cmd_queue_server(args: argparse.Namespace) -> int:
    from strictq.queue_server import run

    if not 0 <= args.port <= 65535:
        print("strictq: --port must be 0-65535", file=sys.stderr)
        return 2
    if not 1 <= args.partitions <= 65536:
        print("strictq: --partitions must be 1-65536", file=sys.stderr)
        return 2
    health = _health_settings(args)
    limits = _connection_limits(args)
    if health is False or limits is None:
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("strictq: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.cluster is not None:
        if args.init:  # a node's stores come from the streams and snapshots, never started empty by hand
            print("strictq: --init is for a single queue server's store, not a cluster node", file=sys.stderr)
            return 2
        return _cluster_node(args, limits, health)
    for flag, value in (
        ("--node", args.node),
        ("--advertise", args.advertise),
        ("--region", args.region or None),
        ("--zone", args.zone or None),
    ):
        if value is not None:
            print(f"strictq: {flag} is for a queue server of a cluster: give --cluster too", file=sys.stderr)
            return 2
    from .fleet_cli import settings_from_args as fleet_settings

    try:
        fleet = fleet_settings(args)
    except ValueError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    from queue_core.internal_auth import secret_file

    secret = secret_file(args.internal_secret)
    return run_server(
        lambda: run(
            args.host,
            args.port,
            args.data_dir,
            args.partitions,
            args.keys,
            health,
            args.init,
            limits,
            fleet,
            secret,
            _tls_pair(args),
        )
    )


def _tls_pair(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """--tls-cert and --tls-key of a queue server (checked to go together), or None: plain HTTP."""
    return None if args.tls_cert is None else (args.tls_cert, args.tls_key)


def _cluster_node(args: argparse.Namespace, limits: Any, health: Any = None) -> int:
    import socket

    from queue_core.internal_auth import secret_file
    from strictq.cluster_node import NodeOptions, run_node

    from .cluster_cli import nats_settings

    settings = nats_settings(args)
    if settings is None:
        return 2
    name = args.node or socket.gethostname()
    from cluster.names import check_node_name

    problem = check_node_name(name)
    if problem:
        print(f"strictq: --node: {problem}", file=sys.stderr)
        return 2
    for flag, value in (("--region", args.region), ("--zone", args.zone)):
        if value and (problem := check_node_name(value, "name")):
            print(f"strictq: {flag}: {problem}", file=sys.stderr)
            return 2
    if args.advertise is not None and not args.advertise.startswith(("http://", "https://")):
        print("strictq: --advertise must be an http:// or https:// URL", file=sys.stderr)
        return 2
    options = NodeOptions(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        name=name,
        nats=settings,
        core_partitions=args.partitions,
        cluster_partitions=args.cluster_partitions,
        replicas=args.replicas,
        limits=limits,
        advertise=args.advertise,
        region=args.region,
        zone=args.zone,
        keys=args.keys,
        health=health,
        secret_file=secret_file(args.internal_secret),
        tls=_tls_pair(args),
    )
    return run_server(lambda: run_node(options))


def _tenant_limit(args: argparse.Namespace) -> Any:
    """--tenant-rate/--tenant-burst as a TenantLimit, None (unlimited), or False after one line saying
    what is wrong."""
    from gateway.rate_limits import InvalidLimit, TenantLimit

    if args.tenant_rate is None:
        if args.tenant_burst is not None:
            print("strictq: --tenant-burst goes with --tenant-rate", file=sys.stderr)
            return False
        return None
    try:
        return TenantLimit.parse(args.tenant_rate, args.tenant_burst)
    except InvalidLimit as exc:
        flag = "--tenant-rate" if exc.message.startswith("rate") else "--tenant-burst"
        print(f"strictq: {flag}: {exc.message}", file=sys.stderr)
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from strictq.serve import ServeOptions, run

    if not 0 <= args.port <= 65535:
        print("strictq: --port must be 0-65535", file=sys.stderr)
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("strictq: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    health = _health_settings(args)
    limits = _connection_limits(args)
    if health is False or limits is None:
        return 2
    from gateway.sqs_regions import parse_regions

    try:
        regions = parse_regions(args.regions)
    except ValueError as exc:
        print(f"strictq: --region: {exc}", file=sys.stderr)
        return 2
    tenant_limit = _tenant_limit(args)
    if tenant_limit is False:
        return 2
    from .fleet_cli import settings_from_args as fleet_settings

    try:
        fleet = fleet_settings(args)
    except ValueError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    options = ServeOptions(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        partitions=args.partitions,
        keys=args.keys,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        insecure_http=args.insecure_http,
        queue_server=args.queue_server,
        proxy=args.proxy,
        proxy_port=args.proxy_port,
        upstream_ca=tuple(args.upstream_ca),
        index=args.index,
        health=health,
        fleet=fleet,
        init=args.init,
        limits=limits,
        regions=tuple(sorted(regions or ())),
        tenant_limit=tenant_limit,
    )
    for flag, value in (("--internal-secret", args.internal_secret), ("--internal-ca", args.internal_ca)):
        if value is not None and args.queue_server is None and args.cluster is None:
            print(f"strictq: {flag} goes with --queue-server or --cluster", file=sys.stderr)
            return 2
    if args.queue_server is not None or args.cluster is not None:
        from queue_core.internal_auth import secret_file

        options = replace(
            options, internal_secret=secret_file(args.internal_secret), internal_ca=args.internal_ca
        )
    if args.queue_server is not None and not args.queue_server.startswith(("http://", "https://")):
        print("strictq: --queue-server must be an http:// or https:// URL", file=sys.stderr)
        return 2
    if args.queue_server is not None and args.init:
        print("strictq: --init is for a store in this process: give it to the queue server", file=sys.stderr)
        return 2
    if args.cluster is not None:
        if args.queue_server is not None:
            print("strictq: --cluster and --queue-server exclude each other: give one", file=sys.stderr)
            return 2
        if args.init:
            print("strictq: --init is for a store in this process, not a cluster's gateway", file=sys.stderr)
            return 2
        from .cluster_cli import nats_settings

        settings = nats_settings(args)
        if settings is None:
            return 2
        edge = edge_options(args)
        if edge is None:
            return 2
        options = replace(options, cluster=settings, **edge)
    elif args.nats_credentials is not None:
        print("strictq: --nats-credentials goes with --cluster", file=sys.stderr)
        return 2
    elif given := [flag for name, flag in EDGE_FLAGS if _given(getattr(args, name))]:
        print(f"strictq: {given[0]} is for an edge of a cluster: it goes with --cluster", file=sys.stderr)
        return 2
    return run_server(lambda: run(options))


def _health_settings(args: argparse.Namespace) -> Any:
    """Failure-management settings from the flags: None (--no-health), or False after printing why not."""
    from .health_cli import settings_from_args

    try:
        return settings_from_args(args)
    except ValueError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return False


# ------------------------------------------------------------------------------------------ client
def add_queue_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queue-server",
        metavar="URL",
        help="talk to a `strictq queue-server`'s internal API at URL instead of `strictq serve` "
        "(default: $STRICTQ_QUEUE_URL; unset: the gateway at $STRICTQ_URL)",
    )


def run_client(
    args: argparse.Namespace,
    internal: Callable[[Any], Coroutine[Any, Any, int]],
    gateway: Callable[[Any], Coroutine[Any, Any, int]],
) -> int:
    """Run a client command against the queue server's internal API (`internal(QueueClient)`) or the
    gateway of `strictq serve` (`gateway(EdgeClient)`); every failure is one line on stderr, exit 1 (2 for
    a setting to fix before anything is sent)."""
    from .cli_endpoint import CliError, endpoint, explain

    try:
        found = endpoint(getattr(args, "queue_server", None))
    except CliError as exc:
        return _fail(str(exc), exc.exit_code)

    async def go() -> int:
        import aiohttp

        try:
            if found.internal:
                return await _run_internal(found, internal)
            from .edge_client import EdgeClient

            async with EdgeClient(found) as client:
                return await gateway(client)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise CliError(await explain(exc, found)) from None

    import asyncio

    try:
        return asyncio.run(go())
    except CliError as exc:
        message = str(exc)
        if getattr(exc, "code", None) == "no_such_route":  # the other server's API
            message += f"; {_other_server(found)}"
        return _fail(message, exc.exit_code)


async def _run_internal(found: Any, work: Callable[[Any], Coroutine[Any, Any, int]]) -> int:
    import os

    from queue_core.client import ClientConfig, QueueClient, QueueClientError
    from queue_core.internal_auth import ENV as SECRET_ENV
    from queue_core.internal_auth import load_secret
    from wirelog.files import StartupError

    from .cli_endpoint import CliError, EdgeError, ssl_context

    if found.https:
        ssl_context(found)  # a missing or bad STRICTQ_CA_FILE named before anything is sent
    try:  # the queue server's internal secret (its `strictq: internal secret <path>` line)
        secret = load_secret(None)
    except StartupError as exc:
        raise CliError(f"{SECRET_ENV}: {exc}", 2) from None
    config = ClientConfig(
        url=found.url,
        ca_file=found.ca_file,
        api_key=os.environ.get("STRICTQ_API_KEY") or None,
        worker_id=os.environ.get("STRICTQ_WORKER_ID") or None,
        internal_secret=secret,
    )
    try:
        async with QueueClient(config=config) as client:
            return await work(client)
    except QueueClientError as exc:
        raise EdgeError(exc.status, exc.code, exc.message) from None


def _other_server(found: Any) -> str:
    if found.internal:
        return (
            f"{found.url} is not a `strictq queue-server` ({found.source}); for `strictq serve` unset "
            "STRICTQ_QUEUE_URL and set STRICTQ_URL"
        )
    return (
        f"{found.url} is not the gateway of `strictq serve` (STRICTQ_URL); for a `strictq queue-server` set "
        "STRICTQ_QUEUE_URL or pass --queue-server"
    )


def _fail(message: str, code: int) -> int:
    print(f"strictq: {' '.join(message.split())}", file=sys.stderr)
    return code


def _key(kind: str) -> str:
    from .edge_client import key_for

    return key_for(kind)[1]


async def _must_exist(client: Any, queue: str) -> None:
    """The EmoDB face answers an unknown queue as an empty one; the CLI says the name is unknown."""
    from .cli_endpoint import CliError

    if await client.exists(queue) is False:
        raise CliError(f"queue {queue!r} does not exist (`strictq queues` lists them)")


def emit(obj: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(obj).decode() + "\n")


def cmd_send(args: argparse.Namespace) -> int:
    import orjson

    bodies: list[str] = []
    for body in args.bodies:
        bodies.extend(
            line for line in sys.stdin.read().splitlines() if line
        ) if body == "-" else bodies.append(body)
    if not bodies:
        print("strictq: nothing to send: give BODY arguments or '-' for standard input", file=sys.stderr)
        return 2
    messages: list[dict[str, Any]] = []
    for body in bodies:
        entry: dict[str, Any]
        if args.json:
            try:
                entry = {"json": orjson.loads(body)}
            except orjson.JSONDecodeError as exc:
                print(f"strictq: not valid JSON ({exc}): {body[:80]}", file=sys.stderr)
                return 2
        else:
            entry = {"body": body}
        for name in ("group", "dedup_id", "message_id", "delay"):
            value = getattr(args, name)
            if value is not None:
                entry["id" if name == "message_id" else name] = value
        messages.append(entry)

    async def internal(client: Any) -> int:
        failed = 0
        for start in range(0, len(messages), 100):
            for result in await client.send(args.queue, messages[start : start + 100]):
                emit(result)
                failed += "error" in result
        return 1 if failed else 0

    async def gateway(client: Any) -> int:
        from .cli_endpoint import CliError

        only_internal = {"--dedup-id": args.dedup_id, "--id": args.message_id, "--delay": args.delay}
        for flag, value in only_internal.items():
            if value is not None:
                raise CliError(
                    f"{flag} is not on the gateway's EmoDB face: give it to a `strictq queue-server` "
                    "(--queue-server URL or STRICTQ_QUEUE_URL), or send through the SQS face",
                    2,
                )
        payloads = [m["json"] if "json" in m else m["body"] for m in messages]
        await client.send(args.queue, payloads, args.group, _key("send"))
        emit({"queue": args.queue, "group": args.group, "sent": len(payloads)})
        return 0

    return run_client(args, internal, gateway)


def cmd_poll(args: argparse.Namespace) -> int:
    async def internal(client: Any) -> int:
        for message in await client.receive(args.queue, args.limit, args.ttl, args.worker or "", args.wait):
            emit(message)
        return 0

    async def gateway(client: Any) -> int:
        from .cli_endpoint import CliError

        if args.worker is not None:
            raise CliError(
                "--worker is for a `strictq queue-server`: through the gateway the claim goes to the "
                "credential of STRICTQ_WORKER_SECRET (its id: STRICTQ_WORKER_ID)",
                2,
            )
        messages = await client.poll(args.queue, args.limit, args.ttl, args.wait, _key("consume"))
        if not messages:
            await _must_exist(client, args.queue)
        for message in messages:
            emit(message)
        return 0

    return run_client(args, internal, gateway)


def cmd_ack(args: argparse.Namespace) -> int:
    if "-" in args.receipts:
        try:
            piped = receipts_from(sys.stdin.read())
        except ValueError as exc:
            print(f"strictq: standard input: {exc}", file=sys.stderr)
            return 2
        args.receipts = [r for r in args.receipts if r != "-"] + piped
        if not args.receipts and not args.ids:
            return 0  # nothing was polled: nothing to acknowledge
    if not args.receipts and not args.ids:
        print("strictq: give RECEIPT arguments or --id", file=sys.stderr)
        return 2

    def finish(results: list[dict[str, Any]]) -> int:
        for result in results:
            emit(result)
        return 0 if all(r["status"] in ("ok", "gone", "accepted") for r in results) else 1

    async def internal(client: Any) -> int:
        results = []
        if args.receipts:
            results += await client.ack(args.queue, args.receipts)
        if args.ids:
            results += await client.ack_ids(args.queue, args.ids, args.token)
        return finish(results)

    async def gateway(client: Any) -> int:
        from .edge_client import parse_receipt

        key = _key("consume")
        results: list[dict[str, Any]] = []
        by_token: dict[int, list[str]] = {}
        for text in args.receipts:
            parsed = parse_receipt(text)
            if parsed is None:
                results.append({"receipt": text, "status": "invalid_receipt", "message": "not a receipt"})
            else:
                by_token.setdefault(parsed[1], []).append(parsed[0])
        for token, ids in by_token.items():  # one fenced ack per claim
            results += await client.ack(args.queue, ids, token, key)
        if args.ids:
            results += await client.ack(args.queue, args.ids, args.token, key)
        return finish(results)

    return run_client(args, internal, gateway)


def receipts_from(text: str) -> list[str]:
    """Receipts from standard input: one per line, or `strictq poll`'s JSON lines (their `receipt`)."""
    import orjson

    receipts: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                found = orjson.loads(line).get("receipt")
            except (orjson.JSONDecodeError, AttributeError):
                found = None
            if not isinstance(found, str):
                raise ValueError(f"line {number} is a JSON object without a 'receipt'")
            line = found
        receipts.append(line)
    return receipts


def cmd_peek(args: argparse.Namespace) -> int:
    async def internal(client: Any) -> int:
        for message in await client.peek(args.queue, args.limit):
            emit(message)
        return 0

    async def gateway(client: Any) -> int:
        messages = await client.peek(args.queue, args.limit, _key("admin"))
        if not messages:
            await _must_exist(client, args.queue)
        for message in messages:
            emit(message)
        return 0

    return run_client(args, internal, gateway)


def cmd_size(args: argparse.Namespace) -> int:
    async def internal(client: Any) -> int:
        info = await client.queue_info(args.queue)
        emit(info["metrics"])
        return 0

    async def gateway(client: Any) -> int:
        counts = await client.size(args.queue, _key("admin"))
        if not counts["total"]:
            await _must_exist(client, args.queue)
        emit(counts)
        return 0

    return run_client(args, internal, gateway)


def cmd_queues(args: argparse.Namespace) -> int:
    def show(names: list[str]) -> int:
        from wirelog.logsafe import escape_controls  # names are client text: no terminal escapes

        for name in names:
            if args.json:
                emit(name)
            else:
                print(escape_controls(name))
        return 0

    async def internal(client: Any) -> int:
        return show(await client.list_queues(args.prefix))

    async def gateway(client: Any) -> int:
        return show(await client.list_queues(args.prefix))

    return run_client(args, internal, gateway)
