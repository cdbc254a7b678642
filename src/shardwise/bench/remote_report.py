"""``shardwise bench remote``'s figures: the best round of each path, its ratios against the
local baseline and the ceiling, and the printed table."""

from __future__ import annotations

import argparse
from typing import Any

from shardwise.errors import ConfigError

TARGET = 0.8
FIRST_BATCH_S = 1.0


def check_same_rows(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Every round of every path read the local path's first and last batch."""
    import numpy as np

    want = runs["local"][0]["rows"]
    for name, rs in runs.items():
        for r in rs:
            if not all(np.array_equal(a, b) for a, b in zip(r["rows"], want, strict=True)):
                raise ConfigError(f"bench remote: the {name} path read other batches than "
                                  "the local cache; a bug, please report it")
            r.pop("rows")


def summarize(runs: dict[str, list[dict[str, Any]]], cache_bytes: int, chunks: int,
              args: argparse.Namespace, top: dict[str, Any]) -> dict[str, Any]:
    """The best round of each path, the ratios, the ceiling and the targets."""
    best = {name: max(rs, key=lambda r: r["examples_per_s"]) for name, rs in runs.items()}
    local = best["local"]["examples_per_s"]
    ratios = {name: b["examples_per_s"] / local for name, b in best.items() if name != "local"}
    example_bytes = (args.seq_len + 1) * 2
    remote = best["remote"]
    consumed = local * example_bytes  # bytes/s of tokens the local path hands over
    # what the remote path must bring after its first batch to keep the local pace: the
    # bytes it received then, over the local round's time
    needed = remote["received_after_first"] / best["local"]["seconds"]
    ceiling = {**top, "vs_local_consumption": top["bytes_per_s"] / consumed,
               "local_consumes_bytes_per_s": consumed,
               "needed_bytes_per_s": needed,
               "bound_vs_local": min(1.0, top["bytes_per_s"] / needed) if needed else None}
    peak = max(r.get("peak_local_bytes", 0) for rs in runs.values() for r in rs)
    local_bytes = remote["local_bytes"]
    return {"config": {k: v for k, v in vars(args).items() if k != "func"},
            "cache_bytes": cache_bytes, "chunks": chunks, "local_bytes": local_bytes,
            "best": best, "ratios_vs_local": ratios, "ceiling": ceiling,
            "max_local_bytes": peak,
            "targets": {"remote_vs_local": TARGET, "met": ratios["remote"] >= TARGET,
                        "first_batch_s": FIRST_BATCH_S,
                        "first_met": remote["first_batch_s"] < FIRST_BATCH_S,
                        "bounded": peak <= local_bytes}}


def print_report(s: dict[str, Any]) -> None:
    """The table: examples/s after the first batch and its ratio to local, the first
    batch, all batches' seconds (first included), CPU seconds per GiB received, bytes
    received, the local copy's peak, and the look-ahead at the end of the round."""
    c, mb = s["config"], 1 << 20
    print(f"cache {s['cache_bytes'] / mb:.0f} MiB in {s['chunks']} chunks of "
          f"{c['chunk_mb']:g} MiB; seq_len {c['seq_len']}, micro-batch {c['micro_batch']}, "
          f"shuffle {c['shuffle']}; {c['batches'] - 1} batches after the first, best of "
          f"{c['repeat']}; SeaweedFS behind a proxy: {c['latency'] * 1e3:.0f} ms per "
          f"request, {c['bandwidth_mb']:g} MB/s per connection; local_bytes "
          f"{s['local_bytes'] / mb:,.0f} MiB")
    print(f"{'path':<11}{'examples/s':>11}{'vs local':>9}{'first batch':>12}{'all':>8}"
          f"{'CPU s/GiB':>10}{'received':>10}{'peak local':>11}  look-ahead at the end")
    for name, b in s["best"].items():
        ratio = "" if name == "local" else f"{s['ratios_vs_local'][name]:.2f}x"
        peak = f"{b['peak_local_bytes'] / mb:,.0f} MiB" if "peak_local_bytes" in b else ""
        cpu = f"{b['cpu_s_per_gib']:.1f}" if "cpu_s_per_gib" in b else ""
        got = f"{b['received'] / mb:,.0f} MiB" if "received" in b else ""
        pf = b.get("prefetch") or {}
        ahead = (f"{pf['target']} chunks, {pf['threads']} threads, "
                 f"{pf.get('ranged_reads', 0)} ranged reads, budget "
                 f"{pf['budget'] / mb:,.0f} MiB, fetch {(pf['fetch_s'] or 0) * 1e3:.0f} ms, "
                 f"waited {pf['waited_s']:.2f} s" if pf else "")
        total = b["first_batch_s"] + b["seconds"]
        print(f"{name:<11}{b['examples_per_s']:>11,.0f}{ratio:>9}"
              f"{b['first_batch_s'] * 1e3:>9.0f} ms{total:>6.2f} s{cpu:>10}{got:>10}{peak:>11}"
              f"  {ahead}")
    t = s["ceiling"]
    bound = f"{t['bound_vs_local']:.2f}x" if t["bound_vs_local"] is not None else "?"
    print(f"ceiling: the same server and proxy serve raw 8 MiB ranged GETs, {t['threads']} "
          f"at once, at {t['bytes_per_s'] / mb:,.0f} MiB/s = {t['vs_local_consumption']:.2f}x "
          f"the {t['local_consumes_bytes_per_s'] / mb:,.0f} MiB/s of tokens the local path "
          f"consumes; after its first batch `remote` received "
          f"{s['best']['remote']['received_after_first'] / mb:,.0f} MiB, "
          f"{t['needed_bytes_per_s'] / mb:,.0f} MiB/s over the local round's time: at the "
          f"ceiling no loader bringing those bytes passes {bound} local")
    g = s["targets"]
    r = s["best"]["remote"]
    print(f"target: remote >= {g['remote_vs_local']}x local: "
          f"{'met' if g['met'] else 'NOT met'} ({s['ratios_vs_local']['remote']:.2f}x); "
          f"first batch < {g['first_batch_s']:g} s: "
          f"{'met' if g['first_met'] else 'NOT met'} ({r['first_batch_s']:.2f} s); local "
          f"copy at most {s['max_local_bytes'] / mb:,.0f} MiB of local_bytes "
          f"{s['local_bytes'] / mb:,.0f} MiB: {'bounded' if g['bounded'] else 'EXCEEDED'}")


__all__ = ["FIRST_BATCH_S", "TARGET", "check_same_rows", "print_report", "summarize"]
