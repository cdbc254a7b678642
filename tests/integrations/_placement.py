"""The placement matrix's readers and layout, shared by ``test_placement_matrix.py`` (the
checker, one process) and ``_placement_run.py`` (one rank of a 2-process run).

Each reader row builds the reader as a user would inside the job (``world=`` left out:
``World.detect()``), the read config ``shardwise trace`` rebuilds the run from, and the
reader's global order in one process (the reference a rank's rows are looked up in).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import shardwise as sw
from shardwise.read.compose.records import CacheRecords

VOCAB = 500
SEQ_LEN, SFT_LEN = 16, 24
MICRO, ACCUMULATION, WORLD = 2, 2, 2
GLOBAL = MICRO * ACCUMULATION * WORLD  # B = 8
STEPS = 3  # optimizer steps trained per reader
EVAL_MICRO = 4  # per-device eval batch: the eval sets below do not divide 2 × 4
SEED, STREAMS, GROUP = 7, 2, 8

Data = dict[str, str]


def make_data(root: Path) -> Data:
    """Two tiny token caches (a blend's parts); the first is also the SFT records."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from cachefactory import make_cache, sample_docs

    out = {}
    records = root / "records.jsonl"  # token records of one length (a record reader's rows)
    rng = np.random.default_rng(13)
    records.write_text("".join(json.dumps({"input_ids": rng.integers(1, VOCAB, SEQ_LEN)
                                           .tolist()}) + "\n" for _ in range(60)))
    out["records"] = str(records)
    for k, (n, seed) in enumerate([(47, 11), (30, 12)]):
        docs = [d[:20] or [1] for d in sample_docs(n, seed=seed, vocab_size=VOCAB)]
        out[f"cache{k}"] = str(make_cache(root / f"cache{k}", [docs], chunk_docs=5,
                                          vocab_size=VOCAB, eod_id=0))
    return out


@dataclass(frozen=True)
class Reader:
    """``make(data, train)``: the reader a rank builds (``train=False``: its eval form, a
    finite pass); ``config(data)``: the read config of the training run (for trace);
    ``iterable``: it places its own examples (no sampler)."""

    make: Callable[[Data, bool], Any]
    config: Callable[[Data], dict[str, Any]] | None  # None: trace reads caches only, so
    iterable: bool  # the check applies the stream rule (rank r's j-th is global j·R + r)
    eval: bool = True  # evaluated under the Trainer (item 6: pads never reach metrics)


def _layout() -> dict[str, Any]:
    return {"global_batch_size": GLOBAL, "micro_batch_size": MICRO, "world_size": WORLD}


def _tokens(d: Data, train: bool) -> Any:
    return sw.TokenDataset(d["cache0"], seq_len=SEQ_LEN, seed=SEED, drop_last=train)


def _blend(d: Data, train: bool) -> Any:
    parts = [sw.TokenDataset(d[c], seq_len=SEQ_LEN, seed=SEED, drop_last=train)
             for c in ("cache0", "cache1")]
    return sw.Blend(parts, [0.6, 0.4], seed=SEED, names=["a", "b"])


def _stream(d: Data, train: bool) -> Any:
    return sw.StreamDataset(d["cache0"], seq_len=SEQ_LEN, streams=STREAMS, seed=SEED,
                            epochs=None if train else 1)


def packed_sft(d: Data, train: bool, **kwargs: Any) -> Any:
    return sw.PackedSFT(CacheRecords(d["cache0"]), seq_len=SFT_LEN, group_size=GROUP,
                        seed=SEED, epochs=None if train else 1, **kwargs)


def _records(d: Data, train: bool) -> Any:
    return sw.RecordStream([d["records"]], seed=SEED, streams=STREAMS, range_bytes=512,
                           map_fn=_as_arrays)


def _as_arrays(record: dict[str, Any]) -> dict[str, Any]:
    """A record as model inputs (HF's per-token labels: a record reader's convention)."""
    ids = np.asarray(record["input_ids"], dtype=np.int64)
    return {"input_ids": ids, "labels": ids}


READERS: dict[str, Reader] = {
    "TokenDataset": Reader(_tokens, lambda d: {"cache": d["cache0"], "reader": "tokens",
                                              "seq_len": SEQ_LEN, "seed": SEED, **_layout()},
                           iterable=False),
    "Blend": Reader(_blend, lambda d: {
        "blend": {"sources": {"a": d["cache0"], "b": d["cache1"]},
                  "weights": {"a": 0.6, "b": 0.4}},
        "reader": "tokens", "seq_len": SEQ_LEN, "seed": SEED, **_layout()},
        iterable=False),
    "StreamDataset": Reader(_stream, lambda d: {
        "cache": d["cache0"], "reader": "stream", "streams": STREAMS, "seq_len": SEQ_LEN,
        "seed": SEED, **_layout()}, iterable=True, eval=False),
    "PackedSFT": Reader(packed_sft, lambda d: {
        "cache": d["cache0"], "reader": "sft", "group_size": GROUP, "seq_len": SFT_LEN,
        "seed": SEED, **_layout()}, iterable=True),
    # a record reader (stream placement, no cache to trace); its eval pass is not padded
    "RecordStream": Reader(_records, None, iterable=True, eval=False),
}


def reference(name: str, d: Data, train: bool, n: int | None) -> list[np.ndarray]:
    """The reader's global order in this one process: its first ``n`` examples' input_ids
    (``None``: all of a finite pass)."""
    if not READERS[name].iterable:
        ds = READERS[name].make(d, train)
        count = len(ds) if n is None else n
        return [np.asarray(ds[i]["input_ids"]) for i in range(count)]
    ds = READERS[name].make(d, train)  # one process: World.detect() is rank 0 of 1
    out = []
    for ex in ds:
        if n is not None and len(out) == n:
            break
        out.append(np.asarray(ex["input_ids"]))
    return out
