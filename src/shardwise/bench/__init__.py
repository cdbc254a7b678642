"""The benchmark harness behind ``shardwise bench``: every figure a ratio against a baseline
measured in the same run.

Each benchmark is a module with ``add_subparser(which)`` (its ``shardwise bench NAME``
arguments) and ``run(args) -> exit code``; :data:`BENCHES` lists them, and ``cli/bench_cmd``
registers them all the same way.
"""

from __future__ import annotations

import argparse

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError

BENCHES = ("build", "read", "stream", "records", "trace", "remote", "plan", "open")


def add_common(p: argparse.ArgumentParser, *, repeat: int, repeat_help: str,
               tmp_dir: str = "where the corpus and caches go (default: the system temp dir)"
               ) -> None:
    """The arguments every benchmark takes: ``--repeat``, ``--tmp-dir``, ``--json``."""
    p.add_argument("--repeat", type=int, default=repeat,
                   help=f"{repeat_help} (default {repeat})")
    p.add_argument("--tmp-dir", default=None, metavar="DIR", help=tmp_dir)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def check_counts(args: argparse.Namespace, **minimums: int) -> None:
    """``--name`` of every bench is an integer of at least its minimum: the one integer
    rule (:func:`~shardwise.checkpoint.as_count`), a :class:`ConfigError` (exit 2)."""
    for name, low in minimums.items():
        as_count(getattr(args, name), f"--{name.replace('_', '-')}", minimum=low,
                 error=ConfigError)


def add_inputs(p: argparse.ArgumentParser, *, corpus: str, tokenizer: str = "tokenizer.json"
               ) -> None:
    """``--corpus`` and ``--tokenizer``, defaulting to the bundled sample (package data)."""
    p.add_argument("--corpus", default=None, metavar="FILE",
                   help=f"{corpus} (default: the bundled sample corpus)")
    p.add_argument("--tokenizer", default=None, metavar="FILE",
                   help=f"{tokenizer} (default: the bundled sample tokenizer)")
