"""``shardwise bench plan``: building a document-shuffle plan at 10M and 100M documents,
beside Megatron-Core's GPTDataset index build on the same ``.idx``, in one run.

For each ``--docs`` size the bench synthesises a Megatron ``.idx`` (log-normal document
lengths, median ``--median-doc`` tokens) and a sparse ``.bin`` of the right size (no
token data is needed to plan; the few tokens an example reads are zeros). Every figure
comes from a fresh ``python -c`` process, so nothing this process mapped helps it:

    build        open the dataset with an empty plan directory and read example 0: the
                 document starts and the plan are built (shardwise), or the document,
                 sample and shuffle indices (GPTDataset); seconds and peak RSS (VmHWM
                 from /proc/self/status, not ru_maxrss, which a child inherits), the
                 growth over the process's peak after its imports
    cached       the same with the plan (index) left by a previous start: time to the
                 first example, open included (target < 50 ms)
    reader RSS   RSS after the first micro-batch and after ``--read-batches`` more
                 (target: the heap flat; the file pages an example maps, its tokens
                 and plan entries read through the page cache, are reported apart)

Ratios are shardwise / Megatron (target below 1: faster and smaller). Best of
``--repeat`` processes for times; the peak of the fastest run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.bench import add_common
from shardwise.bench.child import MEMORY_CODE
from shardwise.bench.read_data import MEGATRON_INSTALL
from shardwise.bench.read_fresh import add_megatron_options, probe
from shardwise.format.megatron import MAGIC, VERSION, dtype_code

TARGETS = {"build_time_vs_megatron": 1.0, "build_memory_vs_megatron": 1.0,
           "first_example_cached_s": 0.050, "reader_heap_growth": 1.1}
DATA_VERSION = 1
BLOCK = 1 << 22

BUILD_CODE = "import json, sys, time\n" + MEMORY_CODE + """
import shardwise
prefix, seq_len, seed, plan_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
before = memory_mb()
t = time.perf_counter()
cache = shardwise.open_cache(prefix)
opened = time.perf_counter() - t
ds = shardwise.TokenDataset(cache, seq_len=seq_len, seed=seed, shuffle="document",
                            plan_dir=plan_dir)
ds[0]
print(json.dumps({**memory_mb(), "before": before, "seconds": time.perf_counter() - t,
                  "open_s": opened, "examples": len(ds)}))
"""
MEGATRON_CODE = "import json, sys, time\n" + MEMORY_CODE + """
from pathlib import Path
from shardwise.bench.read_data import megatron_dataset, quiet
with quiet():  # its imports (torch among them) count before, as shardwise's import does
    import megatron.core.datasets.gpt_dataset
prefix, seq_len, seed, cache_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
before = memory_mb()
ds, info = megatron_dataset(Path(prefix), seq_len, seed, Path(cache_dir),
                            now=lambda: time.perf_counter())
if ds is None:
    raise SystemExit(info["note"])
print(json.dumps({**memory_mb(), "before": before, "seconds": info["first_example_s"],
                  "index_build_s": info["index_build_s"], "examples": len(ds)}))
"""
READ_CODE = "import json, sys\n" + MEMORY_CODE + """
import shardwise
prefix, seq_len, seed, plan_dir, m, nb = sys.argv[1], *map(int, sys.argv[2:4]), sys.argv[4], \\
    *map(int, sys.argv[5:7])
ds = shardwise.TokenDataset(shardwise.open_cache(prefix), seq_len=seq_len, seed=seed,
                            shuffle="document", plan_dir=plan_dir)
ds.get_batch(list(range(m)))
first = memory_mb()
for k in range(1, nb + 1):
    ds.get_batch(list(range(k * m, (k + 1) * m)))
print(json.dumps({"first": first, "after": memory_mb(), "batches": nb, "micro_batch": m}))
"""


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """The ``plan`` subcommand of ``shardwise bench``."""
    p = which.add_parser("plan", help="document-shuffle plan build time and memory at 10M "
                                      "and 100M documents vs Megatron's GPTDataset index")
    p.add_argument("--docs", default="10000000,100000000",
                   help="comma-separated document counts (default 10M and 100M)")
    p.add_argument("--median-doc", type=int, default=400,
                   help="median document length in tokens (default 400)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--read-batches", type=int, default=500,
                   help="micro-batches the reader-RSS process reads (default 500)")
    add_megatron_options(p, keep="the synthesised .idx")
    add_common(p, repeat=2, repeat_help="fresh processes per figure, the fastest kept")
    return p


# -- data ------------------------------------------------------------------------------------
def _lengths(n: int, median: int, seed: int, block: int) -> np.ndarray:
    """Block ``block`` of ``n`` log-normal lengths in [1, 65536] (the same for a seed)."""
    rng = np.random.default_rng([seed, n, block])
    size = min(BLOCK, n - block * BLOCK)
    x = np.rint(rng.lognormal(np.log(median), 1.2, size))
    return np.clip(x, 1, 65_536).astype(np.int32)


def synthesise(prefix: Path, docs: int, median: int, seed: int) -> dict[str, Any]:
    """``prefix.idx`` of ``docs`` one-sequence documents, written block by block (the
    format of :func:`shardwise.format.megatron.idx_bytes`), and a sparse ``prefix.bin``
    of the size it promises; reused while ``prefix.json`` says they were made alike."""
    meta_path = prefix.with_name(prefix.name + ".json")
    want = {"version": DATA_VERSION, "docs": docs, "median": median, "seed": seed}
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in want} == want:
            return {**meta, "made_s": 0.0}
    meta_path.unlink(missing_ok=True)  # written last: its presence means complete files
    started, dtype = time.perf_counter(), np.dtype(np.uint16)
    blocks = range(-(-docs // BLOCK))
    with open(prefix.with_name(prefix.name + ".idx"), "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", VERSION, dtype_code(dtype), docs, docs + 1))
        for b in blocks:
            f.write(_lengths(docs, median, seed, b).tobytes())
        total = 0
        for b in blocks:
            ends = np.cumsum(_lengths(docs, median, seed, b), dtype=np.int64) + total
            starts = np.concatenate(([total], ends[:-1]))
            f.write((starts * dtype.itemsize).tobytes())
            total = int(ends[-1])
        for a in range(0, docs + 1, BLOCK):
            f.write(np.arange(a, min(a + BLOCK, docs + 1), dtype=np.int64).tobytes())
    with open(prefix.with_name(prefix.name + ".bin"), "wb") as f:
        f.truncate(total * dtype.itemsize)  # sparse: no token is ever planned from
    meta = {**want, "tokens": total, "prefix": str(prefix)}
    meta_path.write_text(json.dumps(meta))
    return {**meta, "made_s": time.perf_counter() - started}


# -- measurements ----------------------------------------------------------------------------
def _growth(run: dict[str, Any]) -> float:
    """MB the process's peak grew by after its imports."""
    return float(run["peak_mb"] - run["before"]["peak_mb"])


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(runs, key=lambda x: x["seconds"])
    return {**best, "growth_mb": _growth(best), "runs": [x["seconds"] for x in runs]}


def measure_builds(prefix: Path, args: argparse.Namespace, work: Path,
                   log: Any) -> dict[str, Any]:
    """Cold builds in fresh processes, shardwise and GPTDataset in rotating order; the
    last shardwise plan directory is kept in ``work/plans`` for the cached figures."""
    plans, meg_dir = work / "plans", work / "megatron-index"
    runs: dict[str, list[dict[str, Any]]] = {"shardwise": []}
    if args.megatron:
        runs["megatron"] = []
    for r in range(args.repeat):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            target = plans if name == "shardwise" else meg_dir
            shutil.rmtree(target, ignore_errors=True)
            code = BUILD_CODE if name == "shardwise" else MEGATRON_CODE
            runs[name].append(probe(code, prefix, args.seq_len, args.seed, target,
                                    clock=args.clock))
            log(f"    build {r + 1}/{args.repeat} {name}: {runs[name][-1]['seconds']:.2f} s, "
                f"+{_growth(runs[name][-1]):.0f} MB peak")
    out = {name: _best(v) for name, v in runs.items()}
    if "megatron" in out:
        meg = out["megatron"]
        out["build_time_vs_megatron"] = out["shardwise"]["seconds"] / meg["seconds"]
        out["build_memory_vs_megatron"] = out["shardwise"]["growth_mb"] / meg["growth_mb"]
        cached = [probe(MEGATRON_CODE, prefix, args.seq_len, args.seed, meg_dir,
                        clock=args.clock) for _ in range(args.repeat)]
        out["megatron_cached"] = _best(cached)
    return out


def measure_cached(prefix: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """First example with the plan cached (open included), and the reader's RSS."""
    plans = work / "plans"
    probe(BUILD_CODE, prefix, args.seq_len, args.seed, plans)  # warm: page cache, .pyc
    first = _best([probe(BUILD_CODE, prefix, args.seq_len, args.seed, plans, clock=args.clock)
                   for _ in range(args.repeat)])
    read = probe(READ_CODE, prefix, args.seq_len, args.seed, plans, args.micro_batch,
                 args.read_batches)
    a, b = read["first"], read["after"]
    examples = args.read_batches * args.micro_batch
    read.update(heap_growth=b["anon_mb"] / a["anon_mb"], rss_growth=b["rss_mb"] / a["rss_mb"],
                file_kb_per_example=(b["file_mb"] - a["file_mb"]) * 1024 / examples)
    return {"first_example": first, "reader": read}


def measure_size(docs: int, args: argparse.Namespace, work: Path, log: Any) -> dict[str, Any]:
    """Every figure for one corpus size."""
    prefix = work / f"docs-{docs}"
    data = synthesise(prefix, docs, args.median_doc, args.seed)
    log(f"  {docs:,} documents, {data['tokens']:,} tokens (made in {data['made_s']:.1f} s)")
    builds = measure_builds(prefix, args, work / f"run-{docs}", log)
    cached = measure_cached(prefix, args, work / f"run-{docs}")
    shutil.rmtree(work / f"run-{docs}", ignore_errors=True)
    return {"data": data, "build": builds, **cached}


# -- report ----------------------------------------------------------------------------------
def _mark(value: float, target: float) -> str:
    return "ok" if value < target else "MISSED"


def format_size(docs: str, r: dict[str, Any]) -> list[str]:
    b, f, rd = r["build"], r["first_example"], r["reader"]
    sw = b["shardwise"]
    lines = [f"  {int(docs):,} documents ({r['data']['tokens'] / 1e9:.1f}B tokens, "
             f"{sw['examples']:,} examples)",
             f"    plan build (open + build + example 0)  shardwise {sw['seconds']:.2f} s, "
             f"+{sw['growth_mb']:.0f} MB peak"]
    if "megatron" in b:
        meg = b["megatron"]
        t, m = b["build_time_vs_megatron"], b["build_memory_vs_megatron"]
        lines += [f"    {'':38s} Megatron GPTDataset {meg['seconds']:.2f} s, "
                  f"+{meg['growth_mb']:.0f} MB peak",
                  f"    time ratio {t:.2f} (target < 1: {_mark(t, 1.0)}); peak memory ratio "
                  f"{m:.2f} (target < 1: {_mark(m, 1.0)})"]
    cached = f["seconds"]
    lines.append(f"    first example, plan cached  {cached * 1e3:.0f} ms (open "
                 f"{f['open_s'] * 1e3:.0f} ms; target < 50 ms: {_mark(cached, 0.050)})"
                 + (f"; Megatron, index cached {b['megatron_cached']['seconds'] * 1e3:.0f} ms"
                    if "megatron_cached" in b else ""))
    a, z = rd["first"], rd["after"]
    lines += [f"    reader heap after batch 1 {a['anon_mb']:.0f} MB, after {rd['batches']} more "
              f"{z['anon_mb']:.0f} MB: {rd['heap_growth']:.2f}x (target < 1.1: "
              f"{_mark(rd['heap_growth'], 1.1)})",
              f"    {'':11s} mapped file pages {a['file_mb']:.0f} -> {z['file_mb']:.0f} MB "
              f"({rd['file_kb_per_example']:.0f} KB per example: tokens read through the "
              "page cache, reclaimable)"]
    return lines


def format_report(rep: dict[str, Any]) -> str:
    lines = [f"shardwise bench plan: document-shuffle plans (seq_len {rep['seq_len']}, median "
             f"document {rep['median_doc']} tokens, best of {rep['repeat']} fresh processes, "
             f"{rep['clock']} clock)"]
    for docs, r in rep["sizes"].items():
        lines += format_size(docs, r)
    if "note" in rep:
        lines.append(f"  {rep['note']}")
    lines.append("  peak = VmHWM growth over the process's peak after its imports; mapped "
                 "page-cache pages count (the plan and .idx files a process touched)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``shardwise bench plan``: synthesise, measure, print (``--json``: a dict)."""
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    sizes = [int(x) for x in str(args.docs).split(",") if x.strip()]
    args.megatron = not args.no_megatron and importlib.util.find_spec("megatron") is not None
    work = (Path(args.dir) if args.dir
            else Path(tempfile.mkdtemp(prefix="shardwise-bench-plan-", dir=args.tmp_dir)))
    work.mkdir(parents=True, exist_ok=True)
    rep: dict[str, Any] = {"seq_len": args.seq_len, "median_doc": args.median_doc,
                           "clock": args.clock,
                           "repeat": args.repeat, "targets": TARGETS, "sizes": {},
                           "megatron": args.megatron}
    if not args.megatron and not args.no_megatron:
        rep["note"] = f"megatron-core is not installed; for the baseline: {MEGATRON_INSTALL}"
    try:
        for n in sizes:
            started = time.perf_counter()
            rep["sizes"][str(n)] = measure_size(n, args, work, log)
            rep["sizes"][str(n)]["bench_s"] = time.perf_counter() - started
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0
