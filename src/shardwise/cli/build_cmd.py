"""``shardwise build``: tokenize sources into a cache (resumes an interrupted build)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "build", help="tokenize JSONL / Parquet / Arrow sources into a cache",
        description="Tokenize sources into a chunked, checksummed cache. Running the same "
                    "command again continues from the ledger after an interruption, and "
                    "first checks every chunk an earlier run published (size and xxh3 of "
                    "every file), rebuilding the damaged, truncated or missing ones "
                    "byte-identical; running it with other arguments against an existing "
                    "cache is refused.")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="files, directories or globs of .jsonl, .jsonl.gz, .jsonl.zst, "
                        ".parquet, .arrow; a Hugging Face datasets folder (save_to_disk, "
                        "the datasets cache of one split, a hub cache entry); local, or in a "
                        "bucket ('s3://b/raw/*.jsonl.zst', gs://, az://)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="cache directory, or a bucket prefix (s3://b/cache)")
    p.add_argument("--tokenizer", required=True, metavar="FILE",
                   help="a tokenizer.json saved by the tokenizers library (its truncation and "
                        "padding, if on, are switched off: a build keeps every token)")
    p.add_argument("--text-key", default="text",
                   help="field holding the text (default: text); meta.body: a nested "
                        "field (JSON object, Parquet or Arrow struct)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: all cores); with --executor ray, tasks "
                        "at once (default: every CPU of the cluster)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="run on local processes (default) or on a Ray cluster; Ray tasks "
                        "read the sources and write to --out directly, so local paths must "
                        "be on a filesystem every node mounts at the same path (URLs need "
                        "none)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="with --executor ray: the cluster to join (host:port, or auto); "
                        "default: start a local Ray with --workers CPUs")
    _add_chunking(p)
    return p


def _add_chunking(p: argparse.ArgumentParser) -> None:
    """How chunks are cut and what a rerun does."""
    size = p.add_mutually_exclusive_group()
    size.add_argument("--chunk-docs", type=int, metavar="N", help="documents per chunk")
    size.add_argument("--chunk-mb", type=float, metavar="MB",
                      help="token megabytes per chunk (default: 64)")
    p.add_argument("--append-eod", action="store_true",
                   help="append the end-of-document token to every document")
    p.add_argument("--eod-token", default=None,
                   help="end-of-document token (default: the first of <|endoftext|>, </s>, …)")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                   help="stop at the first bad record naming it (default), or skip and count")
    p.add_argument("--overwrite", action="store_true",
                   help="delete what shardwise wrote in DIR (cache, plans, leftovers) and "
                        "start again; refuses, deleting nothing, if DIR holds other files")
    p.add_argument("--no-verify", action="store_true",
                   help="on a rerun, check only the sizes of the chunks an earlier run "
                        "published, not their checksums (faster on a large cache you trust; "
                        "finds missing and truncated files, not flipped bits)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or log lines")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from shardwise.writer.api import build

    summary = build(args.sources, args.out, tokenizer=args.tokenizer, text_key=args.text_key,
                    workers=args.workers, chunk_docs=args.chunk_docs, chunk_mb=args.chunk_mb,
                    append_eod=args.append_eod, eod_token=args.eod_token,
                    on_error=args.on_error, overwrite=args.overwrite,
                    progress=not args.no_progress, executor=args.executor,
                    address=args.address, verify=not args.no_verify)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary)
    return 0
