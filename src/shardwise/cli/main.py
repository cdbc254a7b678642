"""``shardwise`` entry point: one subcommand per module, each ``add_parser`` + ``run``.

Every subcommand builds a config, calls one library function, prints a human summary
(``--json`` for machines) and returns an exit code: 0 success, 1 the checked thing is bad
(e.g. a damaged cache), 2 usage or input errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from shardwise.errors import ShardwiseError

SUBCOMMANDS = ("build", "inspect", "verify", "convert", "bench")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardwise",
        description="Build tokenized, chunked, checksummed caches and check them.")
    from shardwise._version import __version__

    parser.add_argument("--version", action="version", version=f"shardwise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"shardwise.cli.{name}_cmd")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except ShardwiseError as e:
        print(f"shardwise {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shardwise {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
