"""``shardwise bench remote``: the loader over a cache on an object store that answers every
request ``--latency`` seconds late, beside the same cache on local disk, in one run.

1. A token corpus (:mod:`shardwise.bench.read_data`: ``--tokens`` random tokens, log-normal
   documents) imported as a shardwise cache of ``--chunks`` chunks on local disk.
2. A local S3 server (moto, in its own process) holding a copy of that cache, and
   latency proxies in front of it (:mod:`shardwise.bench.proxy`, each in its own
   process): one adding ``--latency`` to every answer, one adding nothing.
3. ``--repeat`` rounds, in rotating order, each reading ``--batches`` micro-batches of
   ``--micro-batch`` examples through ``shardwise.torch.loader`` (one process, no
   workers) in the same global order (``--shuffle``: ``block`` by default, blocks of
   ``--block-chunks`` chunks' worth of windows shuffled in groups of
   ``--blocks-per-group``, the order a cache larger than its local copy is read in;
   ``window`` reads a random chunk per example)::

       local       open_cache(DIR)                                the baseline
       remote      open_cache(s3://…, local_bytes=…) via the --latency proxy
       fixed       the same with look_ahead=4 micro-batches (the old fixed look-ahead)
       remote_0ms  the same adaptive loader via the proxy that adds nothing

   Every remote round starts from an empty local directory bounded by ``--local-mb``
   (default: a quarter of the cache), so the cache is read from the store while it is
   read. Figures: time to the first batch (after ``open_cache``), examples/s after the
   first batch (the best round of each), and the most bytes the local directory held
   (sampled every 5 ms), against ``local_bytes``.

Target: ``remote`` ≥ 0.8 × ``local`` examples/s, with the local copy within
``local_bytes``. ``remote_0ms`` shows what the machine's own bandwidth allows (moto,
the proxy and the reader share its cores), so a shortfall can be told apart from latency
that was not hidden; the ``ceiling`` line measures the server alone (its chunk files
read four at a time, straight from moto, no proxy, no loader): its bytes/s against those
reading the local copy consumes is what no loader can beat on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardwise.bench import add_common
from shardwise.bench.proxy import start_proxy
from shardwise.bench.read_data import chunked_copy, make_corpus
from shardwise.concurrency import ReadAhead, wait_until
from shardwise.errors import ConfigError, MissingExtraError
from shardwise.format.atomic import TMP_PREFIX

TARGET = 0.8
FIXED_LOOK_AHEAD = 4
BUCKET = "shardwise-bench"
MOTO_INSTALL = "pip install 'shardwise[bench]'  (moto[server])"
KEYS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
PATHS = ("local", "remote", "fixed", "remote_0ms")


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """Register ``remote`` on ``shardwise bench``'s subcommands."""
    p = which.add_parser("remote", help="the loader on an S3 server far away (a local moto "
                                        "behind a latency proxy) vs the same cache on disk")
    p.add_argument("--tokens", type=int, default=64_000_000,
                   help="tokens of the cache (default 64M: 128 MB)")
    p.add_argument("--chunks", type=int, default=32, help="chunks of the cache (default 32)")
    p.add_argument("--local-mb", type=float, default=None,
                   help="local_bytes of the remote cache in MiB (default: a quarter of it)")
    p.add_argument("--latency", type=float, default=0.05,
                   help="seconds added to every answer of the server (default 0.05)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per example (2048)")
    p.add_argument("--micro-batch", type=int, default=8, help="examples per batch (8)")
    p.add_argument("--batches", type=int, default=2000,
                   help="micro-batches read per round (default 2000)")
    p.add_argument("--shuffle", default="block", choices=("block", "window", "none"),
                   help="the global order (default block)")
    p.add_argument("--block-chunks", type=float, default=1.0,
                   help="--shuffle block: a block holds this many chunks' worth of windows "
                        "(default 1)")
    p.add_argument("--blocks-per-group", type=int, default=2,
                   help="--shuffle block: blocks whose windows are shuffled together "
                        "(default 2: a few chunks in use at a time)")
    add_common(p, repeat=3, repeat_help="rounds of every path")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[int]:
    """A moto S3 server in a process of its own (its request log in ``log``: a pipe
    nobody reads would fill and stop the server); yields its port."""
    if importlib.util.find_spec("moto") is None:
        raise MissingExtraError(f"bench remote needs a local S3 server: {MOTO_INSTALL}")
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                 "-p", str(port)], stdout=out, stderr=out)
    try:
        wait_until(lambda: proc.poll() is not None or _listening(port), timeout=30,
                   poll_interval=0.1, what="the moto server")
        if proc.poll() is not None:
            raise MissingExtraError(f"moto's server did not start: "
                                    f"{log.read_text(errors='replace')[-1000:].strip()}; "
                                    f"{MOTO_INSTALL}")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _store_options(port: int) -> dict[str, Any]:
    return {"endpoint_url": f"http://127.0.0.1:{port}", "key": KEYS["aws_access_key_id"],
            "secret": KEYS["aws_secret_access_key"], "skip_instance_cache": True,
            "config_kwargs": {"read_timeout": 60,  # a lost answer fails, never hangs
                              "max_pool_connections": 32}}  # >= downloads at once


def upload(local: Path, url: str, options: dict[str, Any]) -> None:
    """Copy a finished local cache to ``url``: chunk files, then the manifest, then the
    ledger that names them (the order a build publishes in)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.mkdir(root.split("/")[0])
    files = sorted(p for p in local.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(local).parts))
    last = {"manifest.json": 1, "ledger.json": 2}
    for p in sorted(files, key=lambda p: last.get(p.name, 0)):
        fs.pipe_file(f"{root}/{p.relative_to(local).as_posix()}", p.read_bytes())


def store_bandwidth(url: str, port: int, rounds: int) -> float:
    """Bytes/s the server alone (no proxy, no loader) serves the cache's chunk files, four
    GETs at once (the best of ``rounds`` reads of all of them): the most any remote path
    of this machine can reach, whatever the loader does."""
    from shardwise.remote.client import RemoteStore

    store = RemoteStore(url, _store_options(port))
    keys = [k for k in store.list_keys() if k.endswith(".bin")]
    best = 0.0
    for _ in range(rounds):
        started, got = time.perf_counter(), 0
        for i in range(0, len(keys), 4):
            parts = store.get_ranges([(k, 0, 1 << 40) for k in keys[i:i + 4]])
            got += sum(len(b) for b in parts if isinstance(b, bytes))
        best = max(best, got / (time.perf_counter() - started))
    return best


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


def read_round(cache: Any, args: argparse.Namespace, look_ahead: int | None
               ) -> dict[str, Any]:
    """``--batches`` micro-batches through the torch loader: first-batch time, examples/s
    after it, the first and last batch (to check every path reads the same)."""
    import shardwise as sw
    from shardwise.torch import loader

    block_size, per_group = _block_layout(cache, args)
    ds = sw.TokenDataset(cache, seq_len=args.seq_len, seed=1, shuffle=args.shuffle,
                         block_size=block_size, blocks_per_group=per_group)
    dl = loader(ds, global_batch_size=args.micro_batch, micro_batch_size=args.micro_batch,
                world=sw.World.single(), look_ahead=look_ahead)
    started = time.perf_counter()
    it: Any = iter(dl)
    first = next(it)["input_ids"]
    first_s = time.perf_counter() - started
    steady = time.perf_counter()
    last = first
    for _ in range(args.batches - 1):
        last = next(it)["input_ids"]
    seconds = time.perf_counter() - steady
    it.close()
    return {"first_batch_s": first_s,
            "examples_per_s": (args.batches - 1) * args.micro_batch / seconds,
            "rows": (first.numpy().copy(), last.numpy().copy())}


def _block_layout(cache: Any, args: argparse.Namespace) -> tuple[int, int]:
    """``block_size`` (``--block-chunks`` chunks' worth of windows) and
    ``blocks_per_group``."""
    windows_per_chunk = cache.num_tokens / len(cache.chunks) / args.seq_len
    return max(1, round(args.block_chunks * windows_per_chunk)), args.blocks_per_group


def _remote_round(url: str, port: int, node: Path, local_bytes: int,
                  args: argparse.Namespace, look_ahead: int | None) -> dict[str, Any]:
    """One read of the cache on the store through the proxy on ``port``, from an empty
    local directory ``node``."""
    import shardwise as sw

    shutil.rmtree(node, ignore_errors=True)
    started = time.perf_counter()
    cache = sw.open_cache(url, local_dir=node, local_bytes=local_bytes,
                          storage_options=_store_options(port))
    open_s = time.perf_counter() - started
    assert cache.downloads is not None
    with _peak_bytes(cache.downloads.dir) as peak:
        out = read_round(cache, args, look_ahead)
    out.update(open_s=open_s, peak_local_bytes=peak[0],
               prefetch=cache.prefetch_stats(), evicted=cache.downloads.evicted,
               evicted_pinned=cache.downloads.evicted_pinned)
    cache.close()
    shutil.rmtree(node, ignore_errors=True)
    return out


def _rounds(local: Path, url: str, ports: dict[str, int], work: Path, local_bytes: int,
            args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """``--repeat`` rounds of every path, in rotating order."""
    import shardwise as sw

    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    for r in range(args.repeat):
        for name in PATHS[r % len(PATHS):] + PATHS[:r % len(PATHS)]:
            if name == "local":
                cache = sw.open_cache(local)
                runs[name].append(read_round(cache, args, None))
                cache.close()
                continue
            port = ports["0ms" if name == "remote_0ms" else "slow"]
            ahead = FIXED_LOOK_AHEAD if name == "fixed" else None
            runs[name].append(_remote_round(url, port, work / f"node-{name}", local_bytes,
                                            args, ahead))
    return runs


def _check_same_rows(runs: dict[str, list[dict[str, Any]]]) -> None:
    import numpy as np

    want = runs["local"][0]["rows"]
    for name, rs in runs.items():
        for r in rs:
            if not all(np.array_equal(a, b) for a, b in zip(r["rows"], want, strict=True)):
                raise ConfigError(f"bench remote: the {name} path read other batches than "
                                  "the local cache; a bug, please report it")
            r.pop("rows")


def summarize(runs: dict[str, list[dict[str, Any]]], local_bytes: int,
              cache_bytes: int, args: argparse.Namespace, store_bps: float = 0.0
              ) -> dict[str, Any]:
    """The best round of each path, the ratios and whether the targets are met."""
    best = {name: max(rs, key=lambda r: r["examples_per_s"]) for name, rs in runs.items()}
    local = best["local"]["examples_per_s"]
    peak = max(r.get("peak_local_bytes", 0) for rs in runs.values() for r in rs)
    ratios = {name: best[name]["examples_per_s"] / local for name in PATHS[1:]}
    fetch_s = best["remote"]["prefetch"]["fetch_s"] or 0.0
    example_bytes = (args.seq_len + 1) * 2
    bounds = {  # what no look-ahead can beat: bytes in flight = rate × fetch_s
        "fetch_s": fetch_s, "ahead_bytes_for_local_rate": local * example_bytes * fetch_s,
        "ahead_budget": local_bytes // 2,
        "rate_within_budget": local_bytes / 2 / example_bytes / fetch_s if fetch_s else None,
        "remote_vs_0ms": ratios["remote"] / ratios["remote_0ms"],
        "store_bytes_per_s": store_bps, "local_reads_bytes_per_s": local * example_bytes,
        "store_vs_local": store_bps / (local * example_bytes)}
    return {"config": {k: v for k, v in vars(args).items() if k != "func"},
            "cache_bytes": cache_bytes, "local_bytes": local_bytes, "best": best,
            "ratios_vs_local": ratios, "max_local_bytes": peak, "bounds": bounds,
            "targets": {"remote_vs_local": TARGET, "met": ratios["remote"] >= TARGET,
                        "bounded": peak <= local_bytes}}


def print_report(s: dict[str, Any]) -> None:
    c, mb = s["config"], 1 << 20
    print(f"cache {s['cache_bytes'] / mb:.0f} MiB in {c['chunks']} chunks; seq_len "
          f"{c['seq_len']}, micro-batch {c['micro_batch']}, shuffle {c['shuffle']}; "
          f"{c['batches']} batches per round, best of {c['repeat']}; server latency "
          f"{c['latency'] * 1e3:.0f} ms per request; local_bytes "
          f"{s['local_bytes'] / mb:.0f} MiB")
    print(f"{'path':<12}{'examples/s':>12}{'vs local':>10}{'first batch':>13}"
          f"{'peak local':>12}  look-ahead at the end")
    for name in PATHS:
        b = s["best"][name]
        ratio = "" if name == "local" else f"{s['ratios_vs_local'][name]:.2f}x"
        peak = f"{b['peak_local_bytes'] / mb:.0f} MiB" if "peak_local_bytes" in b else ""
        pf = b.get("prefetch") or {}
        ahead = (f"{pf['target']} chunks, {pf['threads']} threads, fetch "
                 f"{(pf['fetch_s'] or 0) * 1e3:.0f} ms, waited {pf['waited_s']:.2f} s"
                 if pf else "")
        print(f"{name:<12}{b['examples_per_s']:>12,.0f}{ratio:>10}"
              f"{b['first_batch_s'] * 1e3:>10.0f} ms{peak:>12}  {ahead}")
    b = s["bounds"]
    within = (f"{b['rate_within_budget']:,.0f}" if b["rate_within_budget"] else "?")
    print(f"bounds: a download takes {b['fetch_s'] * 1e3:.0f} ms, so the local rate needs "
          f"{b['ahead_bytes_for_local_rate'] / mb:.0f} MiB in flight; local_bytes / 2 = "
          f"{b['ahead_budget'] / mb:.0f} MiB allows {within} examples/s; the store's own "
          f"bandwidth allows remote_0ms's rate; remote reaches "
          f"{b['remote_vs_0ms']:.2f}x of remote_0ms")
    print(f"ceiling: the server alone (no proxy, 4 GETs at once) serves "
          f"{b['store_bytes_per_s'] / mb:,.0f} MiB/s = {b['store_vs_local']:.2f}x the "
          f"{b['local_reads_bytes_per_s'] / mb:,.0f} MiB/s that reading the local copy "
          f"consumes: no remote path of this machine can pass {b['store_vs_local']:.2f}x")
    t = s["targets"]
    print(f"target: remote >= {t['remote_vs_local']}x local: "
          f"{'met' if t['met'] else 'NOT met'} ({s['ratios_vs_local']['remote']:.2f}x); "
          f"local copy at most {s['max_local_bytes'] / mb:.0f} MiB of local_bytes "
          f"{s['local_bytes'] / mb:.0f} MiB: {'bounded' if t['bounded'] else 'EXCEEDED'}")


def run(args: argparse.Namespace) -> int:
    if args.tokens < 1 or args.chunks < 1 or args.batches < 2 or args.repeat < 1:
        raise ConfigError("--tokens, --chunks, --repeat must be positive, --batches >= 2")
    work = Path(args.tmp_dir or tempfile.gettempdir()) / "shardwise-bench-remote"
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / f"corpus-{args.tokens}"
    make_corpus(prefix, args.tokens, seed=0)
    local, _ = chunked_copy(prefix, args.chunks)
    cache_bytes = args.tokens * 2
    local_bytes = (int(args.local_mb * (1 << 20)) if args.local_mb is not None
                   else cache_bytes // 4)
    url = f"s3://{BUCKET}/cache"
    with moto_server(work / "moto.log") as port, \
            start_proxy(("127.0.0.1", port), latency=args.latency) as slow, \
            start_proxy(("127.0.0.1", port), latency=0.0) as fast:
        upload(local, url, _store_options(port))
        store_bps = store_bandwidth(url, port, args.repeat)
        runs = _rounds(local, url, {"slow": slow, "0ms": fast}, work, local_bytes, args)
    _check_same_rows(runs)
    summary = summarize(runs, local_bytes, cache_bytes, args, store_bps)
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    else:
        print_report(summary)
    return 0
