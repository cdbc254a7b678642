"""``shardwise bench remote --peer litdata``: shardwise and LitData reading the same tokens
from the same S3 server through the same proxy, each in a fresh process, in one run.

Each reader (this checkout's shardwise, each ``--baseline-src`` tree's, LitData's
``StreamingDataset`` + ``TokensLoader``, litgpt's path) reads micro-batches of
``--micro-batch`` × ``seq_len + 1`` tokens from an empty local directory, twice a round
(rounds in rotating order, medians over ``--repeat``):

* flat out: the first batch, ``--batches`` batches (the first included), then on to the
  end of the epoch; the proxy's counters (:class:`~shardwise.bench.proxy.Counters`) give
  the requests, the most connections open at once, the bytes and the download rate, for
  every client alike; CPU seconds of the reader's process per GiB the proxy answered
  (the clients' imports done before the clock starts, for every reader), and the part of
  it spent off the reader's own thread (``off_main``: the download's threads, obstore's
  included; the reader's thread makes the batches, a bare client makes none);
* stepped: ``--step-ms`` of "training" after every batch, for ``--step-batches`` batches:
  waits over 10 and 50 ms after the first batch, the longest, and the steady stall (time
  in ``next()`` after the first batch over the time since it: the batches' own reading
  time included).

Beside them, with no reader (:data:`CEILING_CODE`, obstore alone): the same server and
proxy serving bare ranged GETs at shardwise's concurrency (the most connections its flat
rounds held open), in 8 MiB and in 32 MiB requests — the ceiling its rate is a ratio of —
and that bare client's CPU seconds per GiB.

LitData downloads through obstore where it is installed; its client options do not allow
plain http (a real bucket is https), so the bench allows it for the proxy's endpoint,
changing nothing else.

The orders differ, as each system defines its shuffle: shardwise's window shuffle is a
keyed permutation of every window of the corpus; LitData shuffles the order of chunks and
the windows inside each chunk (a batch reads one or two chunks, so it can read a chunk at
a time; shardwise's batch reads from all of them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from shardwise.bench.child import child_env, run_child
from shardwise.bench.proxy import ProxyProcess
from shardwise.bench.seaweed import FAKE_ENV

PEERS = ("litdata",)

_LOOP = r'''
waits, tokens, first_s, to_n = [], 0, None, None
last = time.perf_counter()
for i, batch in enumerate(batches):
    now = time.perf_counter()
    waits.append(now - last)
    tokens += int(np.asarray(ids(batch)).size)
    first_s = now - t0 if first_s is None else first_s
    if i + 1 == n:
        to_n = now - t0
        if step:
            break
    if i + 1 == total:  # the epoch's last whole batch (shardwise's loader goes on)
        break
    if step:
        time.sleep(step)
    last = time.perf_counter()
end = time.perf_counter()
after = waits[1:]
spent = end - t0 - first_s
print(json.dumps({"first_s": first_s, "to_n_s": to_n, "epoch_s": None if step else end - t0,
                  "batches": len(waits), "tokens": tokens,
                  "cpu_s": time.process_time() - cpu0, "main_cpu_s": time.thread_time() - main0,
                  "waits_10": sum(w > 0.01 for w in after),
                  "waits_50": sum(w > 0.05 for w in after), "longest": max(after, default=0.0),
                  "stall": sum(after) / spent if spent else 0.0,
                  "stats": stats()}, default=str))
'''

SHARDWISE_CODE = r'''
import json, shutil, sys, time
import numpy as np
url, endpoint, node, seq_len, micro, n, step, shuffle, local_bytes, workers, compact = (
    sys.argv[1:12])
seq_len, micro, n, step, workers = int(seq_len), int(micro), int(n), float(step), int(workers)
local_bytes = int(local_bytes)
import shardwise as sw
from shardwise.torch import loader
import fsspec, s3fs  # noqa: the clients' imports are not the reader's time
try:
    import obstore
except ImportError:
    pass
opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
        "skip_instance_cache": True}
shutil.rmtree(node, ignore_errors=True)
cpu0, main0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
more = {"local_bytes": local_bytes} if local_bytes else {}
cache = sw.open_cache(url, local_dir=node, storage_options=opts, **more)
form = {"output": sw.Output(dtype="stored", compact=True)} if compact == "1" else {}
ds = sw.TokenDataset(cache, seq_len=seq_len, seed=1, shuffle=shuffle, **form)
batches = loader(ds, global_batch_size=micro, micro_batch_size=micro, world=sw.World.single(),
                 num_workers=workers)
ids = lambda b: b["tokens" if form else "input_ids"]
stats = cache.prefetch_stats
total = len(ds) // micro
''' + _LOOP + r'''
cache.close()
shutil.rmtree(node, ignore_errors=True)
'''

LITDATA_CODE = r'''
import json, shutil, sys, time
import numpy as np
url, endpoint, node, seq_len, micro, n, step, shuffle, local_bytes, workers, _ = sys.argv[1:12]
seq_len, micro, n, step, workers = int(seq_len), int(micro), int(n), float(step), int(workers)
from shardwise.bench import litdata_peer
import litdata, boto3, obstore  # the clients' imports are not the reader's time
import litdata.streaming.downloader as dl  # its obstore client, as on https: http allowed
if hasattr(dl, "_OBSTORE_CLIENT_OPTIONS"):
    dl._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
opts = {"endpoint_url": endpoint, "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing", "region_name": "us-east-1"}
shutil.rmtree(node, ignore_errors=True)
cpu0, main0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
ds = litdata_peer.dataset(url, seq_len=seq_len, seed=1, shuffle=shuffle != "none",
                          cache_dir=node, storage_options=opts)
batches = litdata_peer.loader(ds, batch_size=micro, num_workers=workers)
ids = lambda b: b
stats = lambda: {}
total = None
''' + _LOOP + r'''
shutil.rmtree(node, ignore_errors=True)
'''

CEILING_CODE = r'''
import asyncio, json, sys, time
import obstore
from obstore.store import S3Store
endpoint, bucket, prefix, par, piece, files = sys.argv[1:7]
par, piece, files = int(par), int(piece), json.loads(files)
store = S3Store(bucket, prefix=prefix, client_options={"allow_http": True},
                config={"endpoint": endpoint, "access_key_id": "testing",
                        "secret_access_key": "testing", "region": "us-east-1"})
ranges = [(key, a, min(a + piece, size)) for key, size in files
          for a in range(0, size, piece)]
async def main():
    room, got = asyncio.Semaphore(par), 0
    async def one(key, a, b):
        nonlocal got
        async with room:  # (got += await ... would read got before the await)
            n = memoryview(await obstore.get_range_async(store, key, start=a, end=b)).nbytes
            got += n
    await asyncio.gather(*(one(*r) for r in ranges))
    return got
cpu0, t0 = time.process_time(), time.perf_counter()
got = asyncio.run(main())
seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
print(json.dumps({"bytes": got, "seconds": seconds, "bytes_per_s": got / seconds,
                  "cpu_s_per_gib": cpu / (got / 2 ** 30), "threads": par, "piece": piece}),
      flush=True)
import os
os._exit(0)  # obstore's runtime threads can abort at interpreter finalisation (seen: -6)
'''


def check_peer(peer: str) -> None:
    """A missing peer package is a message naming its install line, not a traceback."""
    from shardwise.bench.litdata_peer import require

    require()


def readers(args: argparse.Namespace) -> dict[str, tuple[str, dict[str, str]]]:
    """Label → (child code, environment): this checkout, each ``--baseline-src``, the peer."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for given in args.baseline_src or []:
        label, _, tree = str(given).rpartition("=")
        out[label or "before"] = SHARDWISE_CODE, {**os.environ, "PYTHONPATH": tree}
    out["shardwise"] = SHARDWISE_CODE, child_env()
    if args.peer:
        out[args.peer] = LITDATA_CODE, child_env()
    return out


def _one(code: str, env: dict[str, str], url: str, proxy: ProxyProcess, node: Path,
         args: argparse.Namespace, n: int, step: float, label: str) -> dict[str, Any]:
    endpoint = f"http://127.0.0.1:{proxy.port}"
    local = int(args.local_mb * (1 << 20)) if args.local_mb else 0
    proxy.reset()
    started = time.perf_counter()
    got = run_child(code, url, endpoint, node, args.seq_len, args.micro_batch, n, step,
                    args.shuffle, local, args.workers, int(args.compact), env=env,
                    what=f"bench remote's {label} reader")
    c = proxy.counters()
    gib = max(c.bytes_out / (1 << 30), 1e-9)
    got.update(requests=c.requests, max_connections=c.max_connections, received=c.bytes_out,
               rate=c.rate(), cpu_s_per_gib=got["cpu_s"] / gib,
               off_main_s_per_gib=(got["cpu_s"] - got["main_cpu_s"]) / gib)
    if args.workers:  # the workers' CPU is not counted in the reader process's
        got["cpu_s_per_gib"] = got["off_main_s_per_gib"] = None
    shutil.rmtree(node, ignore_errors=True)
    print(f"  {label}{' stepped' if step else ''}: {time.perf_counter() - started:.1f} s",
          file=sys.stderr, flush=True)
    return got


def compare(urls: dict[str, str], proxy: ProxyProcess, work: Path, args: argparse.Namespace
            ) -> dict[str, Any]:
    """Rounds of every reader (flat, then stepped), in rotating order; then the ceiling at
    shardwise's concurrency. ``urls``: the shardwise cache's, the peer's copy's, and the
    local cache it was uploaded from (``local``: the chunk files the ceiling reads)."""
    who = readers(args)
    names = list(who)
    flat: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    stepped: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    for r in range(args.repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            code, env = who[name]
            url = urls["peer" if name == args.peer else "shardwise"]
            node = work / f"peer-node-{name}"
            flat[name].append(_one(code, env, url, proxy, node, args, args.batches, 0.0, name))
            if args.step_batches:
                stepped[name].append(_one(code, env, url, proxy, node, args, args.step_batches,
                                          args.step_ms / 1e3, name))
    conns = int(statistics.median(f["max_connections"] for f in flat["shardwise"]))
    bucket, _, prefix = urls["shardwise"].removeprefix("s3://").partition("/")
    endpoint = f"http://127.0.0.1:{proxy.port}"
    files = json.dumps([[p.relative_to(urls["local"]).as_posix(), p.stat().st_size]
                        for p in sorted(Path(urls["local"]).rglob("*.bin"))])
    ceilings = [run_child(CEILING_CODE, endpoint, bucket, prefix, conns, piece << 20, files,
                          env=child_env(), what="bench remote's bare client")
                for piece in (8, 32)]
    return {"flat": flat, "stepped": stepped, "ceilings": ceilings, "concurrency": conns}


def _median(rounds: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize_peer(got: dict[str, Any]) -> dict[str, Any]:
    """Medians per reader, the ceiling (the faster of the two request sizes) and the
    ratios the issue's targets are stated in."""
    ceiling = max(got["ceilings"], key=lambda c: c["bytes_per_s"])
    bare_cpu = min(c["cpu_s_per_gib"] for c in got["ceilings"])
    out: dict[str, Any] = {}
    for name, rounds in got["flat"].items():
        row = {k: _median(rounds, k) for k in ("first_s", "to_n_s", "epoch_s", "requests",
                                               "max_connections", "rate", "cpu_s_per_gib",
                                               "received", "tokens",
                                               "off_main_s_per_gib")}
        steps = got["stepped"].get(name) or []
        row.update({k: _median(steps, k) for k in ("waits_10", "waits_50", "stall")})
        row["longest"] = max((s["longest"] for s in steps), default=None)
        row["rate_vs_ceiling"] = row["rate"] / ceiling["bytes_per_s"]
        for key, ratio in (("cpu_s_per_gib", "cpu_vs_bare"),
                           ("off_main_s_per_gib", "off_main_vs_bare")):
            row[ratio] = None if row[key] is None else row[key] / bare_cpu
        row["rounds"] = rounds
        out[name] = row
    return {"readers": out, "ceilings": got["ceilings"], "ceiling": ceiling,
            "bare_cpu_s_per_gib": bare_cpu, "concurrency": got["concurrency"]}


def print_peer(s: dict[str, Any], args: argparse.Namespace) -> None:
    mb = 1e6
    print(f"\nside by side, same server and proxy, each reader a fresh process, median of "
          f"{args.repeat}; {args.batches} batches (first included), then the whole epoch; "
          f"waits: {args.step_batches} batches with a {args.step_ms:g} ms step after each")
    print(f"{'reader':<11}{'first':>7}{'to ' + str(args.batches):>9}{'epoch':>8}"
          f"{'requests/conns':>16}{'MB/s':>7}{'vs ceil':>8}{'CPU s/GiB':>10}{'vs bare':>8}"
          f"{'waits>10/>50ms':>15}{'longest':>9}{'stall':>7}")
    for name, r in s["readers"].items():
        waits = (f"{r['waits_10']:.0f}/{r['waits_50']:.0f}" if r["waits_10"] is not None
                 else "-")
        longest = f"{r['longest'] * 1e3:.0f} ms" if r["longest"] is not None else "-"
        stall = f"{r['stall'] * 100:.1f}%" if r["stall"] is not None else "-"
        epoch = f"{r['epoch_s']:.2f} s" if r["epoch_s"] is not None else "-"
        cpu = (f"{r['cpu_s_per_gib']:>10.2f}{r['cpu_vs_bare']:>7.2f}x"
               if r["cpu_s_per_gib"] is not None else f"{'-':>10}{'-':>8}")
        print(f"{name:<11}{r['first_s']:>5.2f} s{r['to_n_s']:>7.2f} s{epoch:>8}"
              f"{r['requests']:>10.0f} / {r['max_connections']:<3.0f}{r['rate'] / mb:>7.0f}"
              f"{r['rate_vs_ceiling']:>7.2f}x{cpu}{waits:>15}{longest:>9}{stall:>7}")
    for c in s["ceilings"]:
        print(f"ceiling: bare ranged GETs of {c['piece'] >> 20} MiB, {c['threads']} at once "
              f"(shardwise's most connections): {c['bytes_per_s'] / mb:,.0f} MB/s; "
              f"{c['cpu_s_per_gib']:.2f} CPU s/GiB (a bare obstore client)")
    if args.workers:
        print(f"{args.workers} DataLoader workers per reader"
              f"{' (shardwise: compact batches)' if args.compact else ''}: CPU per GiB not "
              "shown (the workers' CPU is not the reader process's)")
        return
    print("CPU s/GiB: all the reader process's CPU (its batches made too) per GiB the proxy "
          "sent; off the reader's thread (the download's share: every other thread, "
          "obstore's included): " + ", ".join(
              f"{name} {r['off_main_s_per_gib']:.2f} ({r['off_main_vs_bare']:.2f}x bare)"
              for name, r in s["readers"].items()))


def write_peer_copy(local: Path, out: Path, url: str, options: dict[str, Any]) -> str:
    """The shardwise cache ``local``'s chunks as LitData chunks (one each,
    :mod:`shardwise.bench.litdata_peer`), uploaded beside the shardwise cache; its URL."""
    import shardwise as sw
    from shardwise.bench.litdata_peer import cache_chunks, write_tokens
    from shardwise.bench.moto import upload

    shutil.rmtree(out, ignore_errors=True)
    cache = sw.open_cache(local)
    try:
        write_tokens(cache_chunks(cache), out)
    finally:
        cache.close()
    upload(out, url, options)
    return url


def side_by_side_rounds(local: Path, url: str, server: Any, proxy: ProxyProcess, work: Path,
                        args: argparse.Namespace) -> dict[str, Any]:
    """The readers side by side (the peer's copy uploaded first), summarized."""
    urls = {"shardwise": url, "local": str(local)}
    if args.peer:
        bucket = url.removeprefix("s3://").split("/")[0]
        urls["peer"] = write_peer_copy(local, work / "litdata", f"s3://{bucket}/litdata",
                                       server.storage_options())
    return summarize_peer(compare(urls, proxy, work, args))


def bench_options(endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint, "key": FAKE_ENV["AWS_ACCESS_KEY_ID"],
            "secret": FAKE_ENV["AWS_SECRET_ACCESS_KEY"], "skip_instance_cache": True}


def dumps(s: dict[str, Any]) -> str:
    return json.dumps(s, indent=1, default=str)


__all__ = ["PEERS", "check_peer", "compare", "print_peer", "side_by_side_rounds",
           "summarize_peer", "write_peer_copy"]
