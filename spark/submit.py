"""Entry point for spark-submit: `spark-submit spark/submit.py index --wirelog DIR --index DIR`.

spark-submit chooses the master and the driver memory (`--master`, `--driver-memory`); the session
builder then leaves them alone. Any `strictq index|errors|search` arguments work.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file by spark-submit: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    from spark.cli import register

    parser = argparse.ArgumentParser(prog="spark-submit spark/submit.py")
    register(parser.add_subparsers(title="commands", metavar="COMMAND"))
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
