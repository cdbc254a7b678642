"""``shardwise bench open``: what opening a cache of many chunks costs a rank, and what
``inspect`` and ``verify --quick`` cost, at two sizes, beside the layout without
``ledger.index`` in the same run.

1. Caches of ``--chunks`` chunks (default 10,000 and 100,000) synthesised by
   :mod:`shardwise.bench.synth` (tiny chunks: opening costs per chunk, not per byte), into
   ``--cache-dir`` (kept and reused) or a temporary directory.
2. Each figure in a fresh interpreter (nothing imported, mapped or cached helps it), in
   rounds that rotate the layouts so a burst of load on a shared machine hits both::

       round r:  index (ledger.index)  │  ledger (ledger.index moved away: how a cache
                 token stream inspect verify   │  written before it opens) token stream …

   ``token``: ``open_cache`` + ``TokenDataset`` (window shuffle) + its first example;
   ``stream``: ``open_cache`` + ``StreamDataset`` as rank 0 of 8 + its first example;
   ``inspect``: the summary ``shardwise inspect --json`` prints (sources, totals, a
   sample of document lengths); ``verify``: ``shardwise verify --quick``.
   Each reports wall and CPU seconds after ``import shardwise`` and the process's peak
   RSS (``VmHWM`` of ``/proc/self/status``, import included); the best of ``--repeat``.
3. Ratios: ``ledger / index`` (what the index saves) and ``largest / smallest`` size
   (how each figure scales with the number of chunks), and the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from shardwise.bench import add_common
from shardwise.bench.child import child_env, memory_mb, run_child
from shardwise.errors import ConfigError

PROBES = ("token", "stream", "inspect", "verify")
LAYOUTS = ("index", "ledger")
TARGET_FIRST_S = 1.0
TARGET_RSS_MB = 300.0
TARGET_VERIFY_US = 20.0  # CPU per chunk: --quick must touch two files of each (the
# system calls alone take ~9 us on a 2-core VM), so it is O(chunks) by nature
SEQ_LEN, STREAMS, RANKS = 64, 8, 8


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """``open`` under ``shardwise bench``'s subcommands."""
    p = which.add_parser("open", help="open + first example, inspect and verify --quick on "
                                       "caches of 10,000 and 100,000 chunks")
    p.add_argument("--chunks", type=int, nargs="+", default=[10_000, 100_000],
                   metavar="N", help="cache sizes in chunks (default 10000 100000)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="keep the synthesised caches here and reuse them on the next run "
                        "(default: a temporary directory, deleted)")
    add_common(p, repeat=3, repeat_help="rounds; the best of each figure is reported")
    return p


def _child_main(spec: dict[str, Any]) -> None:
    """One figure, in a fresh interpreter; prints a JSON line."""
    started = time.perf_counter()
    import shardwise

    wall, cpu = time.perf_counter(), time.process_time()
    imported = wall - started
    path, probe = spec["path"], spec["probe"]
    if probe == "inspect":  # what ``shardwise inspect --json`` computes
        from shardwise.storage.summary import summarize

        orjson.dumps(summarize(shardwise.open_cache(path)).to_dict())
    elif probe == "verify":  # ``shardwise verify --quick``
        from shardwise.storage.verify_quick import verify_quick

        if not verify_quick(path).ok:
            raise SystemExit(f"verify --quick found damage in {path}")
    elif probe == "token":
        ds = shardwise.TokenDataset(shardwise.open_cache(path), seq_len=SEQ_LEN, seed=1)
        ds[0]
    else:
        st = shardwise.StreamDataset(shardwise.open_cache(path), seq_len=SEQ_LEN,
                                     streams=STREAMS, seed=1,
                                     world=shardwise.World(rank=0, size=RANKS))
        next(iter(st))
    print(json.dumps({"seconds": time.perf_counter() - wall,
                      "cpu_seconds": time.process_time() - cpu, "import_s": imported,
                      "peak_mb": memory_mb()["peak_mb"]}))


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    code = ("import sys, json; from shardwise.bench.open import _child_main; "
            "_child_main(json.loads(sys.argv[1]))")
    return run_child(code, json.dumps(spec), env=child_env(OMP_NUM_THREADS="1"),
                     what=f"the {spec['probe']} run")


def synthesise(root: Path, chunks: int, log: Any) -> dict[str, Any]:
    """The cache of ``chunks`` chunks under ``root`` (made unless a previous run left it;
    its index rewritten if a run stopped while it was moved away)."""
    from shardwise.bench.synth import SynthSpec, synth_cache
    from shardwise.format.ledger import Ledger
    from shardwise.format.ledger_index import INDEX_NAME

    spec = SynthSpec(chunks)
    path = root / f"synth-{chunks}"
    started = time.perf_counter()
    made = not (path / INDEX_NAME).is_file() or not (path / "ledger.json").is_file()
    if made and (path / "ledger.json").is_file():  # a run stopped mid-way: restore
        Ledger.load(path).save(path)
        made = False
    elif made:
        shutil.rmtree(path, ignore_errors=True)
        log(f"  synthesising {chunks:,} chunks into {path}")
        synth_cache(path, spec)
    return {"path": str(path), "chunks": chunks, "documents": chunks * spec.docs_per_chunk,
            "made": made, "seconds": time.perf_counter() - started}


def run_rounds(caches: list[dict[str, Any]], repeat: int, work: Path, log: Any
               ) -> dict[str, Any]:
    """``runs[size][layout][probe]``: the best of ``repeat`` rounds."""
    from shardwise.format.ledger_index import INDEX_NAME

    runs: dict[str, Any] = {str(c["chunks"]): {lay: {p: [] for p in PROBES} for lay in LAYOUTS}
                            for c in caches}
    for r in range(repeat):
        for c in caches:
            index, aside = Path(c["path"]) / INDEX_NAME, work / f"{c['chunks']}.index"
            for layout in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
                if layout == "ledger":
                    shutil.move(index, aside)
                try:
                    for probe in PROBES:
                        got = measure({"path": c["path"], "probe": probe})
                        runs[str(c["chunks"])][layout][probe].append(got)
                finally:
                    if layout == "ledger":
                        shutil.move(aside, index)
                log(f"  round {r + 1}/{repeat}: {c['chunks']:,} chunks, {layout}: " + ", ".join(
                    f"{p} {runs[str(c['chunks'])][layout][p][-1]['seconds']:.3f} s"
                    for p in PROBES))
    return {size: {lay: {p: _best(v) for p, v in probes.items()}
                   for lay, probes in layouts.items()} for size, layouts in runs.items()}


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(min(runs, key=lambda x: x["seconds"]))
    best["cpu_seconds"] = min(x["cpu_seconds"] for x in runs)
    best["peak_mb"] = max(x["peak_mb"] for x in runs)
    best["runs"] = [round(x["seconds"], 4) for x in runs]
    return best


def ratios(figures: dict[str, Any]) -> dict[str, Any]:
    """``ledger_vs_index`` per size and probe; ``scaling`` (largest / smallest size) per
    layout and probe, in wall seconds."""
    sizes = sorted(figures, key=int)
    out: dict[str, Any] = {"ledger_vs_index": {
        s: {p: figures[s]["ledger"][p]["seconds"] / figures[s]["index"][p]["seconds"]
            for p in PROBES} for s in sizes}}
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        out["scaling"] = {"from": int(lo), "to": int(hi), **{
            lay: {p: figures[hi][lay][p]["seconds"] / figures[lo][lay][p]["seconds"]
                  for p in PROBES} for lay in LAYOUTS}}
    return out


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    top = max(figures, key=int)
    f, n = figures[top]["index"], int(top)
    out = []
    for p in ("token", "stream", "inspect"):
        out.append({"what": f"{p}: first result < {TARGET_FIRST_S:g} s at {n:,} chunks",
                    "got": f[p]["seconds"], "ok": f[p]["seconds"] < TARGET_FIRST_S})
    cpu, wall = (f["verify"][k] / n * 1e6 for k in ("cpu_seconds", "seconds"))
    out.append({"what": f"verify --quick < {TARGET_VERIFY_US:g} us CPU per chunk at {n:,} "
                        f"chunks (wall: {wall:.1f} us, with this machine's load)",
                "got": cpu, "ok": cpu < TARGET_VERIFY_US})
    peak = max(f[p]["peak_mb"] for p in PROBES)
    out.append({"what": f"peak RSS < {TARGET_RSS_MB:g} MB per process at {n:,} chunks",
                "got": peak, "ok": peak < TARGET_RSS_MB})
    return out


def format_report(report: dict[str, Any]) -> str:
    figs, sizes = report["figures"], sorted(report["figures"], key=int)
    lines = [f"shardwise bench open: synthesised caches ({report['docs_per_chunk']} documents "
             f"per chunk); best of {report['repeat']} fresh processes; seconds after import "
             f"(wall / CPU), peak RSS incl. import; cores {report['cores']}", ""]
    lines.append(f"  {'':<10}" + "".join(f"{f'{int(s):,} chunks':>38}" for s in sizes))
    lines.append(f"  {'':<10}" + f"{'index':>14}{'ledger':>14}{'ratio':>10}" * len(sizes))
    for p in PROBES:
        row = f"  {p:<10}"
        for s in sizes:
            i, g = figs[s]["index"][p], figs[s]["ledger"][p]
            row += (f"{i['seconds']:>8.3f}/{i['cpu_seconds']:<5.3f}"
                    f"{g['seconds']:>8.3f}/{g['cpu_seconds']:<5.3f}"
                    f"{report['ratios']['ledger_vs_index'][s][p]:>9.1f}x")
        lines.append(row)
        lines.append(f"  {'  peak MB':<10}" + "".join(
            f"{figs[s]['index'][p]['peak_mb']:>14.0f}{figs[s]['ledger'][p]['peak_mb']:>14.0f}"
            f"{'':>10}" for s in sizes))
    sc = report["ratios"].get("scaling")
    if sc:
        lines += ["", f"  scaling {sc['from']:,} -> {sc['to']:,} chunks (wall, x): " + "; ".join(
            f"{lay}: " + " ".join(f"{p} {sc[lay][p]:.1f}" for p in PROBES) for lay in LAYOUTS)]
    lines.append("")
    for t in report["targets"]:
        lines.append(f"  target {t['what']}: {t['got']:.3g} {'ok' if t['ok'] else 'MISSED'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``shardwise bench open``: synthesise, measure, print (``--json``: a dict)."""
    from shardwise.bench.synth import SynthSpec

    if args.repeat < 1 or any(n < 1 for n in args.chunks):
        raise ConfigError("--repeat and every --chunks size must be at least 1")
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-", dir=args.tmp_dir) as tmp:
        root = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        caches = [synthesise(root, n, log) for n in sorted(set(args.chunks))]
        figures = run_rounds(caches, args.repeat, Path(tmp), log)
    report: dict[str, Any] = {
        "caches": caches, "figures": figures, "ratios": ratios(figures),
        "repeat": args.repeat, "docs_per_chunk": SynthSpec(1).docs_per_chunk,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count()}
    report["targets"] = targets(figures)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


__all__ = ["add_subparser", "run"]
