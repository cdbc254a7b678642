"""``shardwise bench``: throughput figures, printed as ratios against baselines measured
in the same run (this machine may be shared and noisy)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="measure build and read throughput",
                       description="Measure throughput; every figure is printed beside a "
                                   "baseline measured in the same run, with the ratio.")
    which = p.add_subparsers(dest="bench", metavar="WHAT", required=True)
    b = which.add_parser("build", help="tokens/s of the build for 1..N workers vs the "
                                        "tokenizer's own single-thread speed")
    b.add_argument("--tokenizer", default=None, metavar="FILE",
                   help="tokenizer.json (default: the repository's sample/tokenizer.json)")
    b.add_argument("--corpus", default=None, metavar="FILE",
                   help="JSONL with a 'text' field, repeated to --mb (default: the "
                        "repository's sample/corpus.jsonl)")
    b.add_argument("--mb", type=float, default=64.0,
                   help="MB (10^6 bytes) of text to build (default 64)")
    b.add_argument("--workers", type=int, default=2,
                   help="measure 1, 2, ... up to this many workers (default 2)")
    b.add_argument("--repeat", type=int, default=3,
                   help="runs of each measurement; the best is reported (default 3)")
    b.add_argument("--tmp-dir", default=None, metavar="DIR",
                   help="where the corpus and caches go (default: the system temp dir)")
    b.add_argument("--json", action="store_true", help="print the figures as JSON")
    from shardwise.bench.build import add_executor_argument

    add_executor_argument(b)
    from shardwise.bench.read import add_read_parser

    add_read_parser(which)
    for name in ("stream", "records"):
        module = importlib.import_module(f"shardwise.bench.{name}")
        module.add_subparser(which)
    return p


def run(args: argparse.Namespace) -> int:
    if args.bench == "build":
        from shardwise.bench.build import run_build_bench

        return run_build_bench(args)
    if args.bench == "read":
        from shardwise.bench.read import run_read_bench

        return run_read_bench(args)
    if args.bench in ("stream", "records"):
        return int(importlib.import_module(f"shardwise.bench.{args.bench}").run(args))
    return 2
