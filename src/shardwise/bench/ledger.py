"""``shardwise bench ledger``: the share of a build's time spent saving its progress, with
the journal (a record per save, a snapshot when due) beside the whole-ledger saves it
replaced (a snapshot every save), in the same run on the same corpus.

The corpus is ``--chunks`` one-line documents built with one document per chunk, so the
ledger grows to ``--chunks`` entries (100,000 in the figure the issue asks for; the
default is smaller so that the bench ends in minutes on two cores). ``--bucket`` builds
into a real S3 server started here as well (SeaweedFS, :mod:`shardwise.bench.seaweed`):
there every save is a PUT. The baseline is the old behaviour: the compaction rule set to
"every save" (``COMPACT_EVERY = 0``) and no share of time to keep to
(``writer.api.LEDGER_SHARE``): the whole ledger and its index rewritten every 0.25 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardwise.bench import add_common, check_counts
from shardwise.bench.text_corpus import sample_dir
from shardwise.errors import ConfigError


def add_subparser(which: Any) -> argparse.ArgumentParser:
    p = which.add_parser("ledger", help="the share of a build's time spent saving the "
                         "ledger: journal records vs whole-ledger saves")
    p.add_argument("--chunks", type=int, default=20_000,
                   help="chunks built (one tiny document each; default 20000)")
    p.add_argument("--workers", type=int, default=2, help="build workers (default 2)")
    p.add_argument("--bucket", action="store_true",
                   help="also build into a local S3 server (SeaweedFS, started here)")
    add_common(p, repeat=1, repeat_help="builds of each kind")
    return p


def write_corpus(path: Path, chunks: int) -> None:
    with open(path, "wb") as f:
        for i in range(chunks):
            f.write(b'{"text": "doc %d"}\n' % i)


@contextlib.contextmanager
def _old_saves() -> Iterator[None]:
    """The behaviour the journal replaced: the whole ledger at every save (compaction
    "every save"), every 0.25 s whatever the saves cost (no share of time to keep to)."""
    from shardwise.format import journal
    from shardwise.writer import api

    saved = journal.COMPACT_EVERY, journal.COMPACT_MIN_SECONDS, api.LEDGER_SHARE
    journal.COMPACT_EVERY, journal.COMPACT_MIN_SECONDS, api.LEDGER_SHARE = 0.0, 0.0, 1.0
    try:
        yield
    finally:
        journal.COMPACT_EVERY, journal.COMPACT_MIN_SECONDS, api.LEDGER_SHARE = saved


def one_build(corpus: Path, out: str, tokenizer: Path, workers: int, *, baseline: bool,
              options: dict[str, Any] | None) -> dict[str, Any]:
    from shardwise.writer.api import build

    with _old_saves() if baseline else contextlib.nullcontext():
        started = time.perf_counter()
        s = build([corpus], out, tokenizer=tokenizer, chunk_docs=1, workers=workers,
                  progress=False, overwrite=True, storage_options=options)
        seconds = time.perf_counter() - started
    return {"chunks": s.chunks, "seconds": seconds, "ledger_seconds": s.ledger_seconds,
            "share": s.ledger_seconds / seconds, "records": s.ledger_records,
            "snapshots": s.ledger_snapshots}


def _pair(corpus: Path, out: str, tokenizer: Path, args: argparse.Namespace,
          options: dict[str, Any] | None) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"journal": [], "whole_ledger": []}
    for _ in range(args.repeat):
        for kind in runs:
            runs[kind].append(one_build(corpus, out, tokenizer, args.workers,
                                        baseline=kind == "whole_ledger", options=options))
    best = {k: min(v, key=lambda r: r["share"]) for k, v in runs.items()}
    best["share_ratio"] = best["journal"]["share"] / max(best["whole_ledger"]["share"], 1e-12)
    return best


def _bucket(corpus: Path, tokenizer: Path, args: argparse.Namespace, work: Path
            ) -> dict[str, Any]:
    """The same pair into a bucket of a real S3 server (SeaweedFS) started here."""
    from shardwise.bench.seaweed import s3_environment, seaweed_s3

    with seaweed_s3(work / "seaweedfs", buckets=("ledger-bench",)) as server, \
            s3_environment(server.env):
        return _pair(corpus, "s3://ledger-bench/cache", tokenizer, args, None)


def run(args: argparse.Namespace) -> int:
    check_counts(args, chunks=1, workers=1, repeat=1)
    sample = sample_dir()
    if sample is None:
        raise ConfigError("the bundled sample tokenizer is missing from this install")
    tokenizer = sample / "tokenizer.json"
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-", dir=args.tmp_dir) as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, args.chunks)
        log(f"shardwise bench ledger: building {args.chunks} chunks, locally"
            + (" and into a local S3 server" if args.bucket else ""))
        report: dict[str, Any] = {"chunks": args.chunks, "workers": args.workers,
                                  "local": _pair(corpus, str(work / "cache"), tokenizer,
                                                 args, None)}
        shutil.rmtree(work / "cache", ignore_errors=True)
        if args.bucket:
            report["bucket"] = _bucket(corpus, tokenizer, args, work)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def render(report: dict[str, Any]) -> str:
    lines = [f"shardwise bench ledger: {report['chunks']:,} chunks, {report['workers']} "
             "workers; the share of build time spent saving the ledger"]
    for where in ("local", "bucket"):
        if where not in report:
            continue
        r = report[where]
        for kind in ("journal", "whole_ledger"):
            x = r[kind]
            lines.append(f"  {where:6} {kind:12} {x['seconds']:8.1f} s build  "
                         f"{x['ledger_seconds']:7.2f} s saving = {x['share']:6.2%}  "
                         f"({x['records']} records, {x['snapshots']} snapshots)")
        lines.append(f"  {where:6} journal / whole-ledger share: {r['share_ratio']:.3f}x "
                     f"(target: journal under 5%: "
                     f"{'ok' if r['journal']['share'] < 0.05 else 'MISSED'})")
    return "\n".join(lines)
