"""``shardwise bench read``: examples/s, time to first example and RSS of the reader, beside
baselines measured in the same run on the same Megatron ``.bin/.idx`` data.

The bench writes two corpora (:mod:`shardwise.bench.read_data`): ``--tokens`` and
``--large-factor`` times that (for the size-independence figures), and imports the small
one again as a shardwise cache of ``--chunks`` chunks. On the small one, an untimed
warm-up round, then ``--repeat`` rounds, each reading the examples ``[0, n)``
(``n = --batches × --micro-batch``) through every path in turn, the best (shortest) run of
each kept: a warm steady state, every page in the page cache and mapped, so no path pays
another's page faults::

    plain numpy      windows sliced from np.memmap into a preallocated [m, L+1] int64 array
    ds[i]            TokenDataset.__getitem__, one example per call
    __getitems__     TokenDataset.__getitems__, one micro-batch per call
    loader           shardwise.torch.loader(num_workers=0)
    *_chunked        the same on the chunked cache (a micro-batch's windows in many files)
    *_chunked_trusted  the same with ``open_cache(..., verify=False)``: without the per-batch
                     id check and the background checksum verification, so the report shows
                     what the checks cost on the default path (target: at most 10%)
    *_doc            the same with ``shuffle="document"`` (Megatron's order: documents
                     shuffled, then packed; target: at least 0.7x the window path)
    megatron         megatron.core GPTDataset + torch DataLoader(batch_size=m, num_workers=0)

The background verification hashes each chunk once per node; the untimed warm-up round
starts it and the timed rounds begin once it is done: they show the steady state of a long
run. What a node pays once is shown on its own: a first epoch of the chunked cache from an
empty verified-chunks log (per-batch id checks, and every chunk hashed by the background
thread, waited for) beside the same epoch with ``verify=False``, and the hashing
throughput of the per-chunk check.

The plain-numpy windows are the dataset's own (``ds.windows``), so its rows must equal the
shardwise ``input_ids``/``labels`` on every path; that is checked before timing. Start-up
and RSS are measured in fresh interpreters (:mod:`shardwise.bench.read_fresh`), seek
in this process.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.bench.read_access import access_lines, measure_access
from shardwise.bench.read_data import (
    chunked_copy,
    make_corpus,
    megatron_dataset,
    quiet,
)
from shardwise.bench.read_fresh import (
    CLOCKS,
    add_megatron_options,
    measure_rss,
    measure_startup,
)
from shardwise.bench.read_once import measure_first_epoch, measure_seek, measure_verify_once
from shardwise.bench.read_report import CHUNKED, DOC, TRUSTED, figure_rows, format_report, targets
from shardwise.errors import ConfigError

RSS_NOTE = ("peak RSS counts mapped page-cache pages (the kernel maps up to 64 KB around each "
            "touched page), for plain numpy too; the reader's own memory is the heap row")


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """The ``read`` subcommand of ``shardwise bench``."""
    r = which.add_parser("read", help="examples/s, time to first example and RSS of the "
                                      "reader vs plain numpy and Megatron's GPTDataset")
    r.add_argument("--tokens", type=int, default=50_000_000,
                   help="tokens of the main corpus (default 50M)")
    r.add_argument("--large-factor", type=int, default=4,
                   help="the second corpus is this many times larger (default 4)")
    r.add_argument("--chunks", type=int, default=16,
                   help="the small corpus is also read as a cache of about this many "
                        "chunks (default 16)")
    r.add_argument("--seq-len", type=int, default=2048)
    r.add_argument("--micro-batch", type=int, default=8)
    r.add_argument("--batches", type=int, default=None,
                   help="micro-batches per timed run (default 200; 1000 with --peer)")
    r.add_argument("--rss-batches", type=int, default=500,
                   help="micro-batches read by the RSS processes (default 500)")
    r.add_argument("--repeat", type=int, default=None,
                   help="best of N runs (default 5); with --peer, the median of N rounds "
                        "(default 3)")
    r.add_argument("--peer", choices=["litdata"], default=None,
                   help="only shardwise beside this peer on the same tokens, and the null "
                        "line (see shardwise.bench.read_peer)")
    r.add_argument("--workers", type=int, default=0,
                   help="with --peer: DataLoader workers of every reader (default 0)")
    r.add_argument("--seed", type=int, default=1234)
    add_megatron_options(r, keep="the data")
    r.add_argument("--baseline-src", action="append", default=[], metavar="[LABEL=]DIR",
                   help="also measure random vs consecutive access with the shardwise of "
                        "this src directory (e.g. a worktree at main; label 'before' "
                        "unless given), in the same run; repeatable")
    r.add_argument("--access-only", action="store_true",
                   help="only the random vs consecutive access figures (and the loader)")
    r.add_argument("--json", action="store_true", help="print the figures as JSON")
    return r


# -- in-process throughput --------------------------------------------------------------
def _timed(fn: Callable[[], object], clock: str) -> float:
    now = getattr(time, CLOCKS[clock])
    started = now()
    fn()
    return float(now() - started)


def _numpy_run(mm: npt.NDArray[Any], starts: list[list[int]], L: int) -> Callable[[], None]:
    out = np.empty((len(starts[0]), L + 1), dtype=np.int64)

    def run() -> None:
        for batch in starts:
            for r, s in enumerate(batch):
                out[r] = mm[s: s + L + 1]
    return run


def _same_rows(batch: dict[str, Any], rows: npt.NDArray[np.int64]) -> bool:
    """``input_ids`` and ``labels`` of ``batch`` (numpy or torch) are ``rows`` shifted."""
    L = rows.shape[1] - 1
    inputs, labels = (np.asarray(batch[k]) for k in ("input_ids", "labels"))
    return bool(np.array_equal(inputs.reshape(-1, L), rows[:, :L])
                and np.array_equal(labels.reshape(-1, L), rows[:, 1:]))


def _doc_rows(ds: Any, mm: npt.NDArray[Any]) -> Callable[[list[int]], npt.NDArray[Any]]:
    """Reference rows of a document-shuffled dataset (epoch 0), made apart from its reader:
    the plan built again from the cache's document lengths, each window's pieces sliced
    from the memory-mapped ``.bin`` one by one."""
    from shardwise.plan.doc_shuffle import build_doc_shuffle_index

    c, cache = ds.config, ds.cache
    lengths = np.concatenate([np.asarray(cache.doc_lengths(k), dtype=np.int64)
                              for k in range(len(cache.chunks))])
    starts = np.concatenate(([0], np.cumsum(lengths)))
    index = build_doc_shuffle_index(lengths, seed=c.seed, epoch=0, seq_len=c.seq_len,
                                    drop_last=c.drop_last)

    def rows(idx: list[int]) -> npt.NDArray[Any]:
        return np.stack([np.concatenate([mm[starts[d] + o: starts[d] + o + n]
                                         for d, o, n in index.pieces(w)]).astype(np.int64)
                         for w in idx])
    return rows


def check_identical(readers: dict[str, Any], mm: npt.NDArray[Any], args: argparse.Namespace,
                    loaders: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """The first micro-batches through every shardwise path vs plain-numpy slicing (the
    document-shuffled paths: vs the plan's pieces sliced one by one)."""
    L, m = args.seq_len, args.micro_batch
    k = min(args.batches, 8)
    ok: dict[str, Any] = {"getitem": True, **{f"getitems{s}": True for s in readers},
                          **{f"loader{s}": True for s in loaders}}
    batches = {s: iter(make()) for s, make in loaders.items()}
    ds = readers[""]
    doc_rows = _doc_rows(readers[DOC], mm) if DOC in readers else None
    for b in range(k):
        idx = list(range(b * m, (b + 1) * m))
        want = {"": np.stack([np.asarray(mm[w * L: w * L + L + 1], dtype=np.int64)
                              for w in ds.windows(idx).tolist()])}
        if doc_rows is not None:
            want[DOC] = doc_rows(idx)
        for suffix, reader in readers.items():
            ok[f"getitems{suffix}"] &= _same_rows(reader.__getitems__(idx),
                                                  want.get(suffix, want[""]))
        ok["getitem"] &= all(_same_rows(ds[i], want[""][j: j + 1]) for j, i in enumerate(idx))
        for suffix, it in batches.items():
            ok[f"loader{suffix}"] &= _same_rows(next(it), want.get(suffix, want[""]))
    ok["all"] = all(ok.values())
    return {**ok, "batches": k}


def _drain(items: Any) -> None:
    """Consume an iterable, keeping nothing (each batch is freed before the next)."""
    collections.deque(items, maxlen=0)


def one_round(readers: dict[str, Any], mm: npt.NDArray[Any], args: argparse.Namespace,
              loaders: dict[str, Callable[[], Any]], meg: Any) -> dict[str, float]:
    """Seconds of each read path over examples ``[0, batches·m)``."""
    L, m, nb, c = args.seq_len, args.micro_batch, args.batches, args.clock
    n, ds = nb * m, readers[""]
    windows = ds.windows(np.arange(n)).reshape(nb, m) * L
    idx = [list(range(k * m, (k + 1) * m)) for k in range(nb)]
    out = {"numpy": _timed(_numpy_run(mm, windows.tolist(), L), c),
           "getitem": _timed(lambda: _drain(ds[i] for i in range(n)), c)}
    for suffix, reader in readers.items():
        out[f"getitems{suffix}"] = _timed(functools.partial(_drain, map(reader.__getitems__,
                                                                         idx)), c)
    for suffix, make in loaders.items():
        out[f"loader{suffix}"] = _timed(functools.partial(_drain, itertools.islice(make(), nb)),
                                        c)
    if meg is not None:
        from torch.utils.data import DataLoader

        sampler = [i % len(meg) for i in range(n)]
        mdl = DataLoader(meg, batch_size=m, sampler=sampler, num_workers=0)
        with quiet():
            out["megatron"] = _timed(lambda: _drain(mdl), c)
    return out


def measure_throughput(readers: dict[str, Any], mm: npt.NDArray[Any],
                       args: argparse.Namespace, loaders: dict[str, Callable[[], Any]],
                       meg: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Interleaved rounds of every read path over the same examples; best run of each."""
    n = args.batches * args.micro_batch
    runs: dict[str, list[float]] = {}
    one_round(readers, mm, args, loaders, meg)  # warm-up: map the pages every path reads
    for reader in readers.values():  # the one-time checksums: measured on their own
        reader.cache.wait_for_verify()
    for r in range(args.repeat):
        for k, v in one_round(readers, mm, args, loaders, meg).items():
            runs.setdefault(k, []).append(v)
        log(f"  round {r + 1}/{args.repeat}: " + ", ".join(
            f"{k} {n / v[-1]:,.0f} ex/s" for k, v in runs.items()))
    out: dict[str, Any] = {}
    for k, secs in runs.items():
        best = min(secs)
        out[k] = {"examples_per_s": n / best, "tokens_per_s": n * args.seq_len / best,
                  "batches_per_s": args.batches / best, "seconds": best, "runs": secs,
                  "examples": n}
    return out


def _check_args(args: argparse.Namespace) -> None:
    for name in ("tokens", "large_factor", "chunks", "seq_len", "micro_batch", "batches",
                 "rss_batches", "repeat"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, "
                              f"got {getattr(args, name)}")
    if args.workers < 0 or (args.workers and args.peer is None):
        raise ConfigError(f"--workers {args.workers}: a count of DataLoader workers for "
                          "--peer (the other figures are measured without workers)")
    if args.tokens < 2 * (args.seq_len + 1):
        raise ConfigError(f"--tokens {args.tokens} holds under two windows of --seq-len "
                          f"{args.seq_len} + 1; give more tokens")


def _torch_loaders(readers: dict[str, Any], m: int
                   ) -> tuple[dict[str, Callable[[], Any]], str | None]:
    """A fresh-loader maker per dataset (none, and a note, without torch)."""
    try:
        from shardwise import World
        from shardwise.torch import loader
    except ImportError as e:  # MissingExtraError is an ImportError too
        return {}, f"no loader, seek or Megatron figures: {e}"

    def maker(ds: Any) -> Callable[[], Any]:
        return lambda: loader(ds, global_batch_size=m, micro_batch_size=m, world=World(0, 1),
                              num_workers=0)
    return {suffix: maker(ds) for suffix, ds in readers.items()}, None


def _readers(small: Path, chunked: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The datasets timed: window shuffle on the one ``.bin``, on the chunked cache with
    and without checks, and document shuffle on the one ``.bin``."""
    from shardwise import TokenDataset, open_cache

    readers = {suffix: TokenDataset(open_cache(path, verify=verify), seq_len=args.seq_len,
                                    seed=args.seed)
               for suffix, path, verify in (("", small, True), (CHUNKED, chunked, True),
                                            (TRUSTED, chunked, False))}
    readers[DOC] = TokenDataset(open_cache(small), seq_len=args.seq_len, seed=args.seed,
                                shuffle="document")
    return readers


def _megatron(rep: dict[str, Any], note: str | None, small: Path, args: argparse.Namespace,
              scratch: Callable[[], Path]) -> Any:
    """Megatron's GPTDataset on the small corpus, or None (and why, in the notes)."""
    meg = None
    if note:
        rep["notes"].append(note)
    elif args.no_megatron:
        rep["megatron"] = {"available": False, "note": "skipped (--no-megatron)"}
    else:
        meg, rep["megatron"] = megatron_dataset(small, args.seq_len, args.seed, scratch())
    if rep.get("megatron", {}).get("note"):
        rep["notes"].append(f"Megatron: {rep['megatron']['note']}")
    return meg


def _measure(rep: dict[str, Any], work: Path, args: argparse.Namespace,
             stack: contextlib.ExitStack, log: Callable[[str], None]) -> None:
    """Every figure of the report into ``rep``, on the data in ``work``."""
    large_tokens = rep["config"]["large_tokens"]
    small, large = work / f"tokens-{args.tokens}", work / f"tokens-{large_tokens}"
    log(f"shardwise bench read: writing data in {work}")
    data = rep["data"]
    data["small"] = make_corpus(small, args.tokens, args.seed)
    if not args.access_only:
        data["large"] = make_corpus(large, large_tokens, args.seed)
    if args.access_only:
        meg = _megatron(rep, None, small, args, lambda: Path(stack.enter_context(
            tempfile.TemporaryDirectory(dir=work))))
        rep["access"] = measure_access(small, args, meg, log)
        return
    chunked, n_chunks = chunked_copy(small, args.chunks)
    data["chunked"] = {"path": str(chunked), "chunks": n_chunks}
    readers = _readers(small, chunked, args)
    mm = np.memmap(small.with_name(small.name + ".bin"), dtype=np.uint16, mode="r")
    loaders, note = _torch_loaders(readers, args.micro_batch)
    meg = _megatron(rep, note, small, args, lambda: Path(stack.enter_context(
        tempfile.TemporaryDirectory(dir=work))))
    rep["identical"] = check_identical(readers, mm, args, loaders)
    rep["access"] = measure_access(small, args, meg, log)
    log("  measuring throughput")
    rep["throughput"] = measure_throughput(readers, mm, args, loaders, meg, log)
    rep["verify_once"] = measure_verify_once(chunked, args.clock)
    rep["first_epoch"] = measure_first_epoch(chunked, args)
    if loaders:
        rep["seek"] = measure_seek(small, args)
    log("  measuring start-up and RSS in fresh processes")
    rep["startup"] = measure_startup(small, large, args, work, meg is not None)
    rep["rss"] = measure_rss(small, large, args, work, meg is not None)


def run(args: argparse.Namespace) -> int:
    """``shardwise bench read``: make the data, measure, print (``--json``: a dict)."""
    peer = args.peer is not None
    args.batches = args.batches or (1000 if peer else 200)
    args.repeat = args.repeat or (3 if peer else 5)
    _check_args(args)
    if peer:
        from shardwise.bench import read_peer

        return read_peer.run(args)
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    rep: dict[str, Any] = {"config": {**{k: v for k, v in vars(args).items()
                                         if not k.startswith("_")},
                                      "large_tokens": args.tokens * args.large_factor},
                           "data": {}, "notes": [RSS_NOTE]}
    with contextlib.ExitStack() as stack:
        work = (Path(args.dir) if args.dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="shardwise-bench-read-"))))
        work.mkdir(parents=True, exist_ok=True)
        _measure(rep, work, args, stack, log)
    if args.access_only:
        print(json.dumps(rep, indent=2) if args.json else "\n".join(access_lines(
            rep["access"])))
        return 0
    rep["rows"] = figure_rows(rep)
    rep["targets"] = targets(rep)
    text = format_report(rep) + "\n\n" + "\n".join(access_lines(rep["access"]))
    print(json.dumps(rep, indent=2) if args.json else text)
    return 0 if rep["identical"]["all"] else 1


__all__ = ["add_subparser", "run"]
