"""``shardwise bench read --peer litdata [--workers N]``: shardwise beside LitData on the same
tokens, in one run, with the limit measured beside them.

The corpus (``--tokens``, :mod:`shardwise.bench.read_data`) is imported as a shardwise cache
of ``--chunks`` chunks, and those chunks are written again in LitData's format
(:mod:`shardwise.bench.litdata_peer`: one LitData chunk per shardwise chunk). Every line is
one reader in a fresh interpreter (:mod:`shardwise.bench.read_peer_child`), ``--repeat``
rounds in rotating order, medians; each figure is a ratio to LitData's::

    null              numpy slicing of shardwise's shuffled windows from the corpus in memory
                      (one process: the limit)
    shardwise loader  shardwise.torch.loader(num_workers=N), default batches
    … compact         the same, Output(dtype="stored", compact=True): one uint16 ``tokens``
                      row per window, as the null line and LitData hand over
    __getitems__      TokenDataset.__getitems__ per micro-batch (workers: a torch DataLoader
                      with shardwise's collate, which calls it)
    LitData           StreamingDataset + TokensLoader(seq_len + 1) + StreamingDataLoader
    before …          the loader and __getitems__ of ``--baseline-src`` (e.g. main's src)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from shardwise.bench import litdata_peer
from shardwise.bench.child import child_env, run_child
from shardwise.bench.read_data import chunked_copy, make_corpus

SHARDWISE_ORDER = "shardwise: a keyed permutation of every window of the corpus (global)"
CHILD_CODE = (Path(__file__).with_name("read_peer_child.py")).read_text


def lines_to_run(args: argparse.Namespace) -> list[tuple[str, dict[str, Any], str | None]]:
    """(label, child config, baseline src or None) of every line."""
    out: list[tuple[str, dict[str, Any], str | None]] = [
        ("null", {"path": "null", "workers": 0}, None),
        ("shardwise loader", {"path": "loader"}, None),
        ("shardwise loader compact", {"path": "loader", "compact": True}, None),
        ("shardwise __getitems__", {"path": "getitems"}, None),
        ("LitData", {"path": "litdata"}, None)]
    for spec in args.baseline_src:
        label, _, src = spec.rpartition("=")
        out += [(f"{label or 'before'} loader", {"path": "loader"}, src),
                (f"{label or 'before'} __getitems__", {"path": "getitems"}, src)]
    return out


def _child(cfg: dict[str, Any], src: str | None) -> dict[str, Any]:
    env = child_env()
    if src is not None:  # another shardwise first on the path
        env["PYTHONPATH"] = str(Path(src).resolve()) + ":" + env["PYTHONPATH"]
    return run_child(CHILD_CODE(), json.dumps(cfg), env=env, what=f"the {cfg['path']} reader")


def measure(args: argparse.Namespace, data: dict[str, Any], log: Any) -> dict[str, Any]:
    """Every line, ``--repeat`` rounds in rotating order; the medians."""
    todo = lines_to_run(args)
    got: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in todo}
    base = {"seq_len": args.seq_len, "micro_batch": args.micro_batch, "seed": args.seed,
            "batches": args.batches, "workers": args.workers, **data}
    for r in range(args.repeat):
        for k in range(len(todo)):
            label, cfg, src = todo[(k + r) % len(todo)]
            log(f"  round {r + 1}: {label}")
            got[label].append(_child({**base, **cfg}, src))
    return {label: {key: statistics.median(x[key] for x in runs) for key in runs[0]}
            for label, runs in got.items()}


def report(rep: dict[str, Any]) -> str:
    peer = rep["lines"]["LitData"]["examples_per_s"]
    c = rep["config"]
    out = [f"shardwise bench read --peer litdata: {c['tokens']:,} tokens, {rep['chunks']} "
           f"chunks, seq_len {c['seq_len']}, micro-batch {c['micro_batch']}, "
           f"{c['workers']} DataLoader workers, {c['batches']} batches after the first, "
           f"median of {c['repeat']} rounds (rotating order); LitData {rep['litdata']}",
           f"{'':28}{'examples/s':>12}{'× LitData':>11}{'first batch':>13}"]
    for label, x in rep["lines"].items():
        out.append(f"{label:28}{x['examples_per_s']:12,.0f}"
                   f"{x['examples_per_s'] / peer:10.2f}×{x['first_batch_s']:12.3f}s")
    out += ["order: " + SHARDWISE_ORDER, "order: " + litdata_peer.ORDER,
            "null: one process (no workers), int64 rows, the corpus in memory"]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    version = litdata_peer.require()
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    with contextlib.ExitStack() as stack:
        work = Path(args.dir) if args.dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="shardwise-bench-peer-")))
        work.mkdir(parents=True, exist_ok=True)
        small = work / f"tokens-{args.tokens}"
        log(f"shardwise bench read --peer litdata: writing data in {work}")
        make_corpus(small, args.tokens, args.seed)
        cache, chunks = chunked_copy(small, args.chunks)
        lit = work / f"litdata-{args.tokens}-{chunks}"
        if not (lit / "index.json").is_file():
            from shardwise.storage.opening import open_cache

            litdata_peer.write_tokens(litdata_peer.cache_chunks(open_cache(cache)), lit)
        data = {"cache": str(cache), "litdata": str(lit),
                "bin": str(small.with_name(small.name + ".bin"))}
        rep = {"config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
               "litdata": version, "chunks": chunks, "lines": measure(args, data, log)}
    print(json.dumps(rep, indent=2) if args.json else report(rep))
    return 0


__all__ = ["lines_to_run", "measure", "report", "run"]
