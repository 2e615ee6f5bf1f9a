"""`strictq proxy` and `strictq proxy ca`: registered into the strictq command by `register()`.

Imports nothing heavy at registration: mitmproxy is only loaded when the proxy actually starts.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = Path("var/proxy")
DEFAULT_SERVE_DATA_DIR = Path("var/strictq")  # `strictq serve`'s (and `make run`'s) data dir
DEFAULT_KEYS = Path("var/strictq/keys.toml")  # `strictq serve`'s development key file
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,56}$")  # a wire-log writer name, with room for "-<index>"

DESCRIPTION = """\
Run the egress proxy for workers (mitmproxy, regular proxy mode, HTTPS interception).

Workers send their outbound calls through it with Proxy-Authorization (their own credential from the
key file); it reads the X-Strictq-* tags the SDK adds, strips them, refuses calls of fenced workers and
calls tagged with a stale lease (learnt from the core's control stream, --control), and writes one
wire-log record per call (redacted) to --wirelog.

Prints, once it accepts connections: 'strictq: listening on <url>' (with --processes N, N URLs
separated by commas: use the line as STRICTQ_PROXY_URL), 'strictq: proxy ca <path>' (the CA workers
must trust: STRICTQ_PROXY_CA_FILE) and 'strictq: admin on <url>' (/healthz, /readyz, /metrics). Stops
cleanly on SIGTERM.
"""


def register(commands: Any) -> None:
    """Add `proxy` (with its `ca` subcommand) to the strictq subparsers."""
    proxy = commands.add_parser(
        "proxy",
        help="run the egress proxy that captures and fences workers' outbound calls",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    proxy.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    proxy.add_argument(
        "--port",
        type=int,
        default=8480,
        help="port; 0 picks a free one; with --processes N, ports PORT..PORT+N-1 (default: %(default)s)",
    )
    proxy.add_argument(
        "--data-dir",
        type=Path,
        default=None,  # DEFAULT_DATA_DIR; None tells `strictq proxy ca` it was not given
        help="state directory: the CA (<data-dir>/ca), the redaction key, the default wire log "
        f"(default: {DEFAULT_DATA_DIR})",
    )
    proxy.add_argument(
        "--keys",
        type=Path,
        default=DEFAULT_KEYS,
        help="the gateway's key file: workers authenticate with their credential (default: %(default)s)",
    )
    proxy.add_argument(
        "--control",
        metavar="URL",
        help="URL of the process holding the queue core (strictq serve / queue-server); the proxy follows "
        "its control stream (fences, token floors) and fails closed for tagged calls until synchronised",
    )
    proxy.add_argument(
        "--control-ca", type=Path, metavar="PATH", help="CA (PEM) to verify the control URL's certificate"
    )
    proxy.add_argument(
        "--control-key-id",
        metavar="ID",
        help="key-file credential (role proxy, admin or operator) the control stream is read with; its "
        "tenant is the only one whose workers the proxy serves (others get 407), an operator's serves "
        "every tenant (default: the key file's first proxy credential)",
    )
    proxy.add_argument(
        "--wirelog", type=Path, metavar="DIR", help="wire-log directory (default: <data-dir>/wirelog)"
    )
    proxy.add_argument(
        "--wirelog-fsync",
        choices=("always", "interval", "never"),
        default="interval",
        help="fsync policy of the wire log (default: %(default)s: at most 1 s of records lost on a crash)",
    )
    proxy.add_argument(
        "--redaction",
        type=Path,
        metavar="PATH",
        help="redaction config (omitted headers, JSON fields and query parameters, per-endpoint log levels)",
    )
    proxy.add_argument(
        "--redaction-key-dir",
        type=Path,
        metavar="DIR",
        help="directory of redaction.key, the key of the stable tokens secrets are replaced by (created if "
        "missing; share it with the gateway so both sides tokenize alike) (default: <data-dir>)",
    )
    proxy.add_argument(
        "--upstream-ca",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="extra CA (PEM) trusted for upstream certificates, besides the system roots (repeatable)",
    )
    proxy.add_argument(
        "--admin-host", default="127.0.0.1", help="address of the admin server (default: %(default)s)"
    )
    proxy.add_argument(
        "--admin-port",
        type=int,
        default=8490,
        help="admin port (/healthz, /readyz, /metrics); 0 picks a free one; -1 disables it "
        "(default: %(default)s)",
    )
    proxy.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run N proxy processes, one port each (the SDK spreads workers over them by worker id)",
    )
    proxy.add_argument(
        "--keep-tags",
        action="store_true",
        help="forward the X-Strictq-* tags upstream instead of stripping them",
    )
    proxy.add_argument(
        "--replay-from",
        type=Path,
        metavar="DIR",
        help="replay mode (strictq replay): answer every worker's calls from the recordings in this wire-log "
        "directory, per message and call ordinal first, then by request identity; nothing is forwarded",
    )
    proxy.add_argument(
        "--replay-mask",
        type=Path,
        metavar="PATH",
        help="replay mode: JSON paths and regexes (JSON/TOML file) masked before calls are matched",
    )
    proxy.add_argument(
        "--name",
        default="proxy",
        help="process name: the wire-log writer id (children get NAME-0, NAME-1, ...) (default: %(default)s)",
    )
    proxy.set_defaults(handler=cmd_proxy)

    sub = proxy.add_subparsers(title="subcommands", metavar="SUBCOMMAND")
    ca = sub.add_parser(
        "ca",
        help="print the path of the egress proxy's CA certificate (created if missing)",
        description="Print the path of the CA certificate the egress proxy signs intercepted HTTPS with, "
        "creating the CA on first use; workers trust it (STRICTQ_PROXY_CA_FILE). By default the CA of "
        f"the proxy `strictq serve` (and `make run`) runs, in {DEFAULT_SERVE_DATA_DIR}/proxy/ca; "
        "--data-dir names another serve data dir. `strictq proxy --data-dir DIR ca` names a standalone "
        "proxy's data dir (DIR/ca). The path goes to stdout; which proxy's CA it is, to stderr.",
    )
    ca.add_argument(
        "--data-dir",
        dest="ca_data_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the data dir of `strictq serve --data-dir DIR` (its proxy's CA is DIR/proxy/ca), or of a "
        f"standalone `strictq proxy` (DIR/ca, when DIR has no proxy/) (default: {DEFAULT_SERVE_DATA_DIR})",
    )
    ca.set_defaults(handler=cmd_proxy_ca)


def cmd_proxy(args: argparse.Namespace) -> int:
    from fencing.process import ProxyCommand, run

    if args.data_dir is None:
        args.data_dir = DEFAULT_DATA_DIR
    for name in ("port", "admin_port"):
        value = getattr(args, name)
        if not (-1 if name == "admin_port" else 0) <= value <= 65535:
            print(f"strictq: --{name.replace('_', '-')} must be 0-65535", file=sys.stderr)
            return 2
    if not 1 <= args.processes <= 64:
        print("strictq: --processes must be 1-64", file=sys.stderr)
        return 2
    if args.port and args.port + args.processes - 1 > 65535:
        print("strictq: --port + --processes goes beyond 65535", file=sys.stderr)
        return 2
    if not NAME_RE.fullmatch(args.name):
        print(
            "strictq: --name must be 1-56 letters, digits, '_' or '-' (it names wire-log files)",
            file=sys.stderr,
        )
        return 2
    if not args.keys.exists():
        print(
            f"strictq: key file {args.keys} not found (--keys: the gateway's key file, e.g. written by "
            "strictq serve)",
            file=sys.stderr,
        )
        return 2
    if args.replay_from is not None and not args.replay_from.is_dir():
        print(f"strictq: --replay-from {args.replay_from} is not a directory", file=sys.stderr)
        return 2
    if args.replay_mask is not None and args.replay_from is None:
        print("strictq: --replay-mask needs --replay-from", file=sys.stderr)
        return 2
    extra = (args.redaction, args.control_ca, args.replay_mask)
    for path in [*args.upstream_ca, *(p for p in extra if p is not None)]:
        if not path.is_file():
            print(f"strictq: {path} is not a file", file=sys.stderr)
            return 2
    if args.control and not args.control.startswith(("http://", "https://")):
        print("strictq: --control must be an http(s) URL", file=sys.stderr)
        return 2
    if args.control_key_id is not None and not args.control:
        print("strictq: --control-key-id needs --control", file=sys.stderr)
        return 2
    problem = _check_files(args)
    if problem:
        print(f"strictq: {problem}", file=sys.stderr)
        return 2
    command = ProxyCommand(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        keys=args.keys,
        control=args.control,
        control_ca=args.control_ca,
        control_key_id=args.control_key_id,
        wirelog=args.wirelog,
        redaction=args.redaction,
        redaction_key_dir=args.redaction_key_dir,
        upstream_ca=list(args.upstream_ca),
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        processes=args.processes,
        keep_tags=args.keep_tags,
        name=args.name,
        wirelog_fsync=args.wirelog_fsync,
        replay_from=args.replay_from,
        replay_mask=args.replay_mask,
    )
    return run(command)


def _check_files(args: argparse.Namespace) -> str | None:
    """Start-up faults of the files, as one line naming the file (None: fine). The data dir is created
    0700 here, before the CA and the redaction key are written into it."""
    from access.keys import KeyFileError, KeyRing
    from wirelog.files import StartupError, check_writable, private_dir

    try:
        KeyRing.load(args.keys)
    except KeyFileError as exc:
        return f"{args.keys}: {exc}; fix it (schema in the README) or give another --keys"
    try:
        private_dir(args.data_dir)
        check_writable(args.data_dir)
    except StartupError as exc:
        return str(exc)
    except OSError as exc:
        return f"{args.data_dir}: cannot create it ({exc.strerror or exc}); choose another --data-dir"
    return None


def cmd_proxy_ca(args: argparse.Namespace) -> int:
    from fencing.ca import confdir, ensure_ca, serve_proxy_dir
    from wirelog.files import private_dir

    data_dir, whose = proxy_ca_dir(args.ca_data_dir, args.data_dir)
    try:
        if args.data_dir is None and data_dir == serve_proxy_dir(data_dir.parent):
            private_dir(data_dir.parent)  # a serve data dir not made yet: 0700, as serve makes it
        path = ensure_ca(data_dir)
    except OSError as exc:
        print(f"strictq: {confdir(data_dir)}: cannot create the CA ({exc.strerror or exc})", file=sys.stderr)
        return 1
    print(path)
    print(f"strictq: the CA of {whose} (workers trust it: STRICTQ_PROXY_CA_FILE)", file=sys.stderr)
    return 0


def proxy_ca_dir(ca_data_dir: Path | None, proxy_data_dir: Path | None) -> tuple[Path, str]:
    """The proxy data dir whose CA `strictq proxy ca` prints, and whose proxy that is (for the user):
    `strictq proxy --data-dir P ca` -> P; `ca --data-dir D` -> D/proxy (a serve data dir), or D itself
    when D is a standalone proxy's (it has ca/ and no proxy/); neither -> var/strictq/proxy."""
    from fencing.ca import confdir, serve_proxy_dir

    if ca_data_dir is None and proxy_data_dir is not None:
        return proxy_data_dir, f"the proxy of `strictq proxy --data-dir {proxy_data_dir}`"
    serve_dir = ca_data_dir if ca_data_dir is not None else DEFAULT_SERVE_DATA_DIR
    if confdir(serve_dir).is_dir() and not serve_proxy_dir(serve_dir).exists():
        return serve_dir, f"the proxy of `strictq proxy --data-dir {serve_dir}`"
    return serve_proxy_dir(serve_dir), f"the egress proxy of `strictq serve --data-dir {serve_dir}`"
