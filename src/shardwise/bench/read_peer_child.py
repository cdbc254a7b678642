"""One reader of ``shardwise bench read --peer``, timed in a fresh interpreter.

Run as a file (``python read_peer_child.py JSON``), so the same measurement runs against
another shardwise (a checkout of main, on ``PYTHONPATH``: the "before" figures): it uses
only shardwise's public API, and ``output=`` only where asked. Prints one JSON line:
``first_batch_s`` (from making the loader to its first batch: worker start-up included)
and ``examples_per_s`` over the next ``batches`` micro-batches.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any


def _shardwise(cfg: dict[str, Any]) -> Any:
    import shardwise as sw

    extra: dict[str, Any] = ({"output": sw.Output(dtype="stored", compact=True)}
                             if cfg.get("compact") else {})  # main has no output=
    return sw.TokenDataset(cfg["cache"], seq_len=cfg["seq_len"], seed=cfg["seed"], **extra)


def _batches(cfg: dict[str, Any]) -> Iterator[Any]:
    path, m, w = cfg["path"], cfg["micro_batch"], cfg["workers"]
    if path == "loader":
        import shardwise as sw
        from shardwise.torch import loader

        return iter(loader(_shardwise(cfg), global_batch_size=m, micro_batch_size=m,
                           world=sw.World(0, 1), num_workers=w))
    if path == "getitems":
        ds = _shardwise(cfg)
        if w == 0:
            return (ds.__getitems__(list(range(i * m, (i + 1) * m))) for i in range(10**9))
        from torch.utils.data import DataLoader

        from shardwise.torch import collate

        return iter(DataLoader(ds, batch_size=m, num_workers=w, collate_fn=collate))
    if path == "litdata":
        from shardwise.bench import litdata_peer

        ds = litdata_peer.dataset(cfg["litdata"], seq_len=cfg["seq_len"], seed=cfg["seed"])
        return iter(litdata_peer.loader(ds, batch_size=m, num_workers=w))
    if path == "null":
        return _null(cfg)
    raise ValueError(f"unknown path {path!r}")


def _null(cfg: dict[str, Any]) -> Iterator[Any]:
    """numpy slicing of shardwise's shuffled windows from the corpus held in memory."""
    import numpy as np

    ds = _shardwise(cfg)
    L, m = cfg["seq_len"], cfg["micro_batch"]
    mem = np.fromfile(cfg["bin"], dtype=np.uint16)
    n = (cfg["batches"] + 1) * m
    starts = (ds.windows(np.arange(n)) * L).tolist()
    out = np.empty((m, L + 1), dtype=np.int64)
    for i in range(0, n, m):
        for r, s in enumerate(starts[i: i + m]):
            out[r] = mem[s: s + L + 1]
        yield out


def measure(cfg: dict[str, Any]) -> dict[str, float]:
    started = time.perf_counter()
    it = _batches(cfg)
    next(it)
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(cfg["batches"]):
        next(it)
    took = time.perf_counter() - started
    return {"first_batch_s": first,
            "examples_per_s": cfg["batches"] * cfg["micro_batch"] / took}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
