"""Figures of ``shardwise bench read`` a node pays once, or at a start, each timed on its
own: the per-chunk checksum pass the background verification runs once per node, a first
epoch on a node that has verified nothing yet, and a loader's start deep in the data."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from shardwise.bench.read_fresh import CLOCKS


def measure_verify_once(cache_dir: Path, clock: str) -> dict[str, Any]:
    """The per-chunk checksum check the background verification runs once per node, over
    the whole chunked cache (``verify_cache`` runs the same ``check_chunk``)."""
    from shardwise.storage.verify import verify_cache

    now = getattr(time, CLOCKS[clock])
    started = now()
    report = verify_cache(cache_dir)
    seconds = now() - started
    return {"seconds": seconds, "bytes": report.bytes_checked, "ok": report.ok,
            "chunks": report.chunks_checked, "mb_per_s": report.bytes_checked / 1e6 / seconds}


def measure_first_epoch(cache_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One epoch of ``cache_dir`` through ``__getitems__`` on a node that has verified
    nothing yet (its log removed), the background hashing included (waited for), beside
    the same epoch with ``verify=False``; best of ``--repeat``."""
    from shardwise import TokenDataset, open_cache
    from shardwise.format.paths import READER_DIR
    from shardwise.storage.verifier import LOG_DIR

    now, m = getattr(time, CLOCKS[args.clock]), args.micro_batch
    best = {"checks": float("inf"), "trusted": float("inf")}
    n = hashed = 0
    for _ in range(args.repeat):
        for name, verify in (("checks", True), ("trusted", False)):
            shutil.rmtree(cache_dir / READER_DIR / LOG_DIR, ignore_errors=True)
            ds = TokenDataset(open_cache(cache_dir, verify=verify), seq_len=args.seq_len,
                              seed=args.seed)
            n = len(ds) // m * m
            started = now()
            for k in range(0, n, m):
                ds.__getitems__(list(range(k, k + m)))
            ds.cache.wait_for_verify()
            ds.cache.raise_if_damaged()
            best[name] = min(best[name], now() - started)
            hashed = max(hashed, ds.cache.verify_stats()["hashed"])
            ds.cache.close()
    return {**best, "examples": n, "hashed_chunks": hashed}


def measure_seek(prefix: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Loader construction plus its first batch, deep in the data (epoch 3) vs at 0."""
    from shardwise import TokenDataset, World, open_cache
    from shardwise.torch import loader

    m, now = args.micro_batch, getattr(time, CLOCKS[args.clock])
    probe = TokenDataset(open_cache(prefix), seq_len=args.seq_len, seed=args.seed)
    deep = (3 * len(probe) + len(probe) // 2) // m * m
    out: dict[str, Any] = {"consumed": deep}
    for name, consumed in (("zero", 0), ("deep", deep)):
        best = float("inf")
        for _ in range(args.repeat):
            ds = TokenDataset(open_cache(prefix), seq_len=args.seq_len, seed=args.seed)
            started = now()
            next(iter(loader(ds, global_batch_size=m, micro_batch_size=m, world=World(0, 1),
                             num_workers=0, consumed=consumed)))
            best = min(best, now() - started)
        out[name] = best
    return out
