"""``shardwise bench``: throughput figures, printed as ratios against baselines measured
in the same run (this machine may be shared and noisy). Each benchmark is a module of
:mod:`shardwise.bench` with ``add_subparser`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from shardwise.bench import BENCHES


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="measure build and read throughput",
                       description="Measure throughput; every figure is printed beside a "
                                   "baseline measured in the same run, with the ratio.")
    which = p.add_subparsers(dest="bench", metavar="WHAT", required=True)
    for name in BENCHES:
        importlib.import_module(f"shardwise.bench.{name}").add_subparser(which)
    return p


def run(args: argparse.Namespace) -> int:
    module = args.bench.replace("-", "_")  # `bench remote-open` is bench/remote_open.py
    return int(importlib.import_module(f"shardwise.bench.{module}").run(args))
