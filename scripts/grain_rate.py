"""Grain batched reads, before → after: examples/s of Grain's own ``.batch`` (one
``__getitem__`` per example) against ``shardwise.grain.batch`` (one ``_getitems`` per
batch), over ``grain.MapDataset.source(TokenDataset).shuffle(...)``, with the reader's
own ``get_batch`` as the ceiling. ``--no-grain-shuffle`` leaves Grain's shuffle out (the
reader's order is already shuffled; Grain's per-index shuffle costs about a third of a
batched read). Usage (from the repository root)::

    PYTHONPATH=src python scripts/grain_rate.py [--seq-len 512] [--batch 64] [--batches 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grain

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import shardwise as sw  # noqa: E402
from cachefactory import make_cache, sample_docs  # noqa: E402
from shardwise.grain import batch  # noqa: E402


def rate(get: Any, batches: int, size: int) -> float:
    get(0)  # warm: maps the chunks the first batch reads
    start = time.perf_counter()
    for i in range(1, batches + 1):
        get(i)
    return batches * size / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-grain-shuffle", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        docs = sample_docs(40_000, seed=1, vocab_size=32_000, max_len=4000)
        cache = make_cache(Path(tmp) / "c", [docs], chunk_docs=2000, vocab_size=32_000)
        ds = sw.TokenDataset(cache, seq_len=a.seq_len, seed=1)
        src = grain.MapDataset.source(ds)
        if not a.no_grain_shuffle:
            src = src.shuffle(seed=1)
        before = src.batch(a.batch, drop_remainder=True)
        after = batch(src, a.batch, drop_remainder=True)
        B = a.batch
        runs: dict[str, list[float]] = {"grain .batch": [], "shardwise.grain.batch": [],
                                        "TokenDataset.get_batch": []}
        for _ in range(a.repeats):
            runs["grain .batch"].append(rate(before.__getitem__, a.batches, B))
            runs["shardwise.grain.batch"].append(rate(after.__getitem__, a.batches, B))
            runs["TokenDataset.get_batch"].append(rate(
                lambda i: ds.get_batch(list(range(i * B, (i + 1) * B))), a.batches, B))
        order = "source" if a.no_grain_shuffle else "source.shuffle"
        print(f"{len(ds):,} examples of {a.seq_len} tokens, grain.MapDataset.{order}, "
              f"batches of {B}, median of {a.repeats}:")
        for name, r in runs.items():
            print(f"  {name:24s} {statistics.median(r):>10,.0f} examples/s")


if __name__ == "__main__":
    main()
