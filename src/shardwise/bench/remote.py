"""``shardwise bench remote``: the loader over a cache on an S3 server far away, beside the
same cache on local disk, in one run.

1. A token corpus (:mod:`shardwise.bench.read_data`: ``--tokens`` random tokens, log-normal
   documents) imported as a shardwise cache in ``--chunk-mb`` chunks on local disk.
2. SeaweedFS (``weed mini``, :mod:`shardwise.bench.seaweed`) holding a copy of it, behind
   two proxies (:mod:`shardwise.bench.proxy`, each in its own process, each capping every
   connection at ``--bandwidth-mb`` MB/s, like one S3 connection): one adding
   ``--latency`` to every answer, one adding nothing.
3. Rounds in rotating order (``--repeat``), each reading ``--batches`` micro-batches of
   ``--micro-batch`` examples through ``shardwise.torch.loader`` (one process, no workers)
   in the same global order (``--shuffle``, window by default)::

       local       open_cache(DIR)                                    the baseline
       before      the store at --latency, every lever off: s3fs for GETs, whole chunks
                   only, the look-ahead bounded by local_bytes / 2, a chunk's blocks one
                   after another
       remote_0ms  every lever on, through the proxy that adds no latency
       remote      every lever on, at --latency                       the figure
       no_ranged, no_native, no_pace, no_group   (--ablate) ``remote`` with one lever
                   off

   Every remote round starts from an empty local directory bounded by ``local_bytes``.
4. ``ceiling``: the same server and proxy serving raw ranged GETs (8 MiB blocks of every
   chunk file, the ``remote`` round's client) at the ``remote`` round's concurrency, with
   no loader: bytes/s, against the bytes/s the local read path consumes.

Figures: examples/s after the first batch and its ratio to ``local``; time to the first
batch (after ``open_cache``); CPU seconds of the loader's process per GiB it received; the
most bytes the local copy held (sampled every 5 ms) against ``local_bytes``. Target (issue
21): ``remote`` ≥ 0.8 × ``local``, first batch < 1 s, the local copy within local_bytes.

5. ``--peer litdata`` (and ``--baseline-src [LABEL=]DIR``: another checkout's shardwise):
   every reader side by side on the same server and proxy, each in a fresh process
   (:mod:`shardwise.bench.remote_peer`): first batch, time to ``--batches`` and to the end
   of the epoch, requests and connections (the proxy's counters), download rate against
   the ceiling at shardwise's concurrency, CPU per GiB against a bare client's, waits with
   a ``--step-ms`` step. ``--compare-only`` skips the paths of 3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from shardwise.bench import add_common
from shardwise.bench.moto import upload
from shardwise.bench.proxy import proxy_process, start_proxy
from shardwise.bench.read_data import chunked_copy, make_corpus
from shardwise.concurrency import ReadAhead, ThreadPool
from shardwise.errors import ConfigError
from shardwise.format.atomic import TMP_PREFIX

BUCKET = "shardwise-bench"
# each path: (proxy, levers off)
PATHS: dict[str, tuple[str, frozenset[str]]] = {
    "local": ("", frozenset()),
    "before": ("slow", frozenset({"ranged", "native", "pace", "group"})),
    "remote_0ms": ("fast", frozenset()),
    "remote": ("slow", frozenset()),
    "no_ranged": ("slow", frozenset({"ranged"})),
    "no_native": ("slow", frozenset({"native"})),
    "no_pace": ("slow", frozenset({"pace"})),
    "no_group": ("slow", frozenset({"group"})),
}
BASIC = ("local", "before", "remote_0ms", "remote")
QUICK = {"tokens": 24_000_000, "chunk_mb": 8.0, "batches": 401}


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """Register ``remote`` on ``shardwise bench``'s subcommands."""
    p = which.add_parser("remote", help="the loader on an S3 server far away (SeaweedFS "
                                        "behind a latency and bandwidth proxy) vs the same "
                                        "cache on disk")
    p.add_argument("--tokens", type=int, default=162_500_000,
                   help="tokens of the cache (default 162.5M: 325 MB)")
    p.add_argument("--chunk-mb", type=float, default=64.0,
                   help="chunk size in MiB (default 64)")
    p.add_argument("--local-mb", type=float, default=None,
                   help="local_bytes of the remote cache in MiB (default: open_cache's)")
    p.add_argument("--latency", type=float, default=0.05,
                   help="seconds added to every answer of the server (default 0.05)")
    p.add_argument("--bandwidth-mb", type=float, default=100.0,
                   help="MB/s each connection is capped at (default 100)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per example (2048)")
    p.add_argument("--micro-batch", type=int, default=8, help="examples per batch (8)")
    p.add_argument("--batches", type=int, default=2001,
                   help="micro-batches read per round (default 2001: 2000 after the first)")
    p.add_argument("--shuffle", default="window", choices=("window", "block", "none"),
                   help="the global order (default window)")
    p.add_argument("--ablate", action="store_true",
                   help="also run `remote` with each lever off (no_ranged, no_native, "
                        "no_pace, no_group)")
    p.add_argument("--quick", action="store_true",
                   help=f"a small run: {QUICK['tokens'] // 1_000_000}M tokens in "
                        f"{QUICK['chunk_mb']:g} MiB chunks, {QUICK['batches']} batches")
    p.add_argument("--peer", choices=("litdata",), default=None,
                   help="also read the same tokens with LitData (StreamingDataset + "
                        "TokensLoader) from the same server and proxy, side by side")
    p.add_argument("--baseline-src", action="append", default=[], metavar="[LABEL=]DIR",
                   help="also read with the shardwise of this src directory (e.g. a "
                        "worktree at main), side by side; repeatable")
    p.add_argument("--step-ms", type=float, default=20.0,
                   help="the side-by-side waits: ms of 'training' after each batch (20)")
    p.add_argument("--step-batches", type=int, default=None,
                   help="batches of the stepped side-by-side read (default --batches; "
                        "0: none)")
    p.add_argument("--workers", type=int, default=0,
                   help="DataLoader workers of every side-by-side reader (default 0)")
    p.add_argument("--compact", action="store_true",
                   help="side-by-side shardwise readers hand over compact batches "
                        "(Output(dtype='stored', compact=True): uint16 tokens, as LitData's)")
    p.add_argument("--compare-only", action="store_true",
                   help="only the side-by-side readers (not the paths of the levers)")
    add_common(p, repeat=1, repeat_help="rounds of every path")
    return p


@contextlib.contextmanager
def _peak_bytes(directory: Path | None) -> Iterator[list[int]]:
    """The most bytes ``directory`` holds (sampled every 5 ms on a thread), in ``out[0]``."""
    out, stop = [0], threading.Event()

    def sample(_: object) -> int:
        while not stop.wait(0.005):
            if directory is not None:
                out[0] = max(out[0], _dir_bytes(directory))
        return out[0]

    thread = ReadAhead.call(sample, None, name="shardwise-bench-du")
    try:
        yield out
    finally:
        stop.set()
        out[0] = max(out[0], thread.get())
        thread.close(None)


def _dir_bytes(d: Path) -> int:
    total = 0
    for dirpath, dirnames, names in os.walk(d):
        dirnames[:] = [n for n in dirnames if not n.startswith(".")]
        for n in names:
            if not n.startswith(".") or n.startswith(TMP_PREFIX):  # partial downloads count
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(dirpath, n)).st_size
    return total


def read_round(cache: Any, args: argparse.Namespace,
               received: Callable[[], int] = lambda: 0) -> dict[str, Any]:
    """``--batches`` micro-batches through the torch loader: first-batch time, examples/s
    after it, the first and last batch (to check every path reads the same), and the
    bytes ``received()`` after the first batch."""
    import shardwise as sw
    from shardwise.torch import loader

    ds = sw.TokenDataset(cache, seq_len=args.seq_len, seed=1, shuffle=args.shuffle)
    dl = loader(ds, global_batch_size=args.micro_batch, micro_batch_size=args.micro_batch,
                world=sw.World.single())
    started = time.perf_counter()
    it: Any = iter(dl)
    first = next(it)["input_ids"]
    first_s = time.perf_counter() - started
    at_first = received()
    steady = time.perf_counter()
    last = first
    for _ in range(args.batches - 1):
        last = next(it)["input_ids"]
    seconds = time.perf_counter() - steady
    it.close()
    return {"first_batch_s": first_s, "seconds": seconds,
            "received_after_first": received() - at_first,
            "examples_per_s": (args.batches - 1) * args.micro_batch / seconds,
            "rows": (first.numpy().copy(), last.numpy().copy())}


def _remote_round(url: str, endpoint: str, node: Path, local_bytes: int | None,
                  args: argparse.Namespace, off: frozenset[str]) -> dict[str, Any]:
    """One read of the cache on the store through the proxy at ``endpoint``, from an empty
    local directory ``node``, with the levers ``off`` switched off."""
    import shardwise as sw
    from shardwise.bench import levers
    from shardwise.remote.client import RemoteStore
    from shardwise.storage.bucket import BucketStore

    shutil.rmtree(node, ignore_errors=True)
    remote = RemoteStore(url, _options(endpoint),
                         client="fsspec" if "native" in off else "auto")
    cpu, started = time.process_time(), time.perf_counter()
    more: dict[str, Any] = {} if local_bytes is None else {"local_bytes": local_bytes}
    cache = sw.open_cache(remote, local_dir=node, **more)
    open_s = time.perf_counter() - started
    store = cache.store
    assert isinstance(store, BucketStore) and store.downloads is not None
    levers.switch_off(store, off)
    with _peak_bytes(store.downloads.dir) as peak:
        out = read_round(cache, args, lambda: remote.received)
    cpu = time.process_time() - cpu
    out.update(open_s=open_s, peak_local_bytes=peak[0], local_bytes=store.downloads.max_bytes,
               prefetch=cache.prefetch_stats(), received=remote.received, cpu_s=cpu,
               cpu_s_per_gib=cpu / max(remote.received / (1 << 30), 1e-9),
               native=remote.native, evicted=store.downloads.evicted,
               evicted_pinned=store.downloads.evicted_pinned)
    cache.close()
    shutil.rmtree(node, ignore_errors=True)
    return out


def _options(endpoint: str) -> dict[str, Any]:
    from shardwise.bench.seaweed import FAKE_ENV

    return {"endpoint_url": endpoint, "key": FAKE_ENV["AWS_ACCESS_KEY_ID"],
            "secret": FAKE_ENV["AWS_SECRET_ACCESS_KEY"], "skip_instance_cache": True}


def _rounds(local: Path, url: str, endpoints: dict[str, str], work: Path,
            local_bytes: int | None, args: argparse.Namespace, paths: list[str]
            ) -> dict[str, list[dict[str, Any]]]:
    """``--repeat`` rounds of every path, in rotating order."""
    import shardwise as sw

    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    for r in range(args.repeat):
        for name in paths[r % len(paths):] + paths[:r % len(paths)]:
            proxy, off = PATHS[name]
            if name == "local":
                cache = sw.open_cache(local)
                runs[name].append(read_round(cache, args))
                cache.close()
                continue
            runs[name].append(_remote_round(url, endpoints[proxy], work / f"node-{name}",
                                            local_bytes, args, off))
    return runs


def ceiling(url: str, endpoint: str, threads: int, native: bool) -> dict[str, Any]:
    """Bytes/s the server and proxy at ``endpoint`` serve raw ranged GETs of every chunk
    file, 8 MiB each, ``threads`` at once (the client the loader used): what no loader
    at that concurrency can pass."""
    from shardwise.remote.client import RemoteStore

    remote = RemoteStore(url, _options(endpoint), client="auto" if native else "fsspec")
    blocks = [(k, a, a + (8 << 20)) for k in remote.list_keys() if k.endswith(".bin")
              for a in range(0, remote.size(k), 8 << 20)]
    pool = ThreadPool(threads, name="shardwise-bench-ceiling")
    try:
        started = time.perf_counter()
        futures = [pool.submit(partial(_length, remote, b)) for b in blocks]
        got = sum(f.result() for f in futures)
        seconds = time.perf_counter() - started
    finally:
        pool.close()
    return {"bytes_per_s": got / seconds, "bytes": got, "seconds": seconds,
            "threads": threads}


def _length(remote: Any, block: tuple[str, int, int]) -> int:
    return len(remote.read_range(*block))


def _check_args(args: argparse.Namespace) -> bool:
    """``--quick``'s sizes, the arguments checked, the peer found; whether readers run side
    by side."""
    from shardwise.bench.remote_peer import check_peer

    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.tokens < 1 or not args.chunk_mb > 0 or args.batches < 2 or args.repeat < 1:
        raise ConfigError("--tokens, --chunk-mb, --repeat must be positive, --batches >= 2")
    if args.workers < 0:
        raise ConfigError(f"--workers must be 0 or more, got {args.workers}")
    if args.peer:
        check_peer(args.peer)
    if args.step_batches is None:
        args.step_batches = args.batches
    return bool(args.peer or args.baseline_src or args.compare_only)


def run(args: argparse.Namespace) -> int:
    from shardwise.bench.remote_peer import print_peer, side_by_side_rounds
    from shardwise.bench.remote_report import check_same_rows, print_report, summarize
    from shardwise.bench.seaweed import seaweed_s3

    side_by_side = _check_args(args)
    work = Path(args.tmp_dir or tempfile.gettempdir()) / "shardwise-bench-remote"
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / f"corpus-{args.tokens}"
    make_corpus(prefix, args.tokens, seed=0)
    cache_bytes = args.tokens * 2
    local, chunks = chunked_copy(prefix, max(1, round(cache_bytes / (args.chunk_mb
                                                                     * (1 << 20)))))
    local_bytes = None if args.local_mb is None else int(args.local_mb * (1 << 20))
    paths = list(BASIC) + (["no_ranged", "no_native", "no_pace", "no_group"] if args.ablate
                           else [])
    url, bandwidth = f"s3://{BUCKET}/cache", args.bandwidth_mb * 1e6
    shutil.rmtree(work / "seaweed", ignore_errors=True)
    summary: dict[str, Any] = {}
    with seaweed_s3(work / "seaweed", buckets=(BUCKET,)) as server, \
            proxy_process(server.address, latency=args.latency, bandwidth=bandwidth) as slow, \
            start_proxy(server.address, latency=0.0, bandwidth=bandwidth) as fast:
        upload(local, url, server.storage_options())
        endpoints = {p: f"http://127.0.0.1:{port}" for p, port in (("slow", slow.port),
                                                                   ("fast", fast))}
        if not args.compare_only:
            runs = _rounds(local, url, endpoints, work, local_bytes, args, paths)
            best = max(runs["remote"], key=lambda r: r["examples_per_s"])
            top = ceiling(url, endpoints["slow"], max(2, int(best["prefetch"]["threads"])),
                          best["native"])
            check_same_rows(runs)
            summary = summarize(runs, cache_bytes, chunks, args, top)
        if side_by_side:
            summary["side_by_side"] = side_by_side_rounds(local, url, server, slow, work, args)
    shutil.rmtree(work / "seaweed", ignore_errors=True)
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
        return 0
    if "best" in summary:
        print_report(summary)
    if side_by_side:
        print_peer(summary["side_by_side"], args)
    return 0
