"""``shardwise bench records``: RecordStream start-up, records/s and RSS on a multi-GB JSONL,
beside Hugging Face ``datasets`` streaming on the same file and function, in the same run.

The corpus is the bundled sample's JSONL (or ``--corpus``) repeated until ``--gb`` GB
(10^9 bytes), written once into a temporary directory. Every measurement runs in a fresh
interpreter (start-up and RSS are then its own), in interleaved rounds so a burst of load
on a shared machine hits every figure alike; the best of ``--repeat`` rounds is kept::

    round r:  HF streaming │ RecordStream, 0 workers │ 1 worker │ … │ N workers

Each run times: building the reader (``start``), reaching the first example
(``first``), then ``--records`` examples (records/s); RSS is the peak of the reading
process and, separately, of its largest processing worker. The file is in the page cache
for every run (it was just written), so the figures compare CPU work, not the disk.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shardwise.bench import add_common, add_inputs, check_counts
from shardwise.bench.child import memory_mb, run_child
from shardwise.errors import ConfigError

GB = 1_000_000_000
TARGET_START_S = 1.0
TARGET_RSS_MB = 1024.0
TARGET_VS_HF = 2.0
FUNCTIONS = ("light", "tokenize")
_TOKENIZER: Any = None


def light(record: dict[str, Any]) -> dict[str, Any]:
    """The ``light`` function: a couple of fields derived from the text."""
    text = record["text"]
    return {"id": record["id"], "chars": len(text), "lines": text.count("\n") + 1}


def tokenize(record: dict[str, Any]) -> dict[str, Any]:
    """The ``tokenize`` function: the sample tokenizer over the text (one thread)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        from tokenizers import Tokenizer

        _TOKENIZER = Tokenizer.from_file(os.environ["SHARDWISE_BENCH_TOKENIZER"])
    return {"id": record["id"], "input_ids": _TOKENIZER.encode(record["text"]).ids}


def add_subparser(which: Any) -> argparse.ArgumentParser:
    """``records`` under ``shardwise bench``'s subcommands."""
    p = which.add_parser("records", help="RecordStream start-up, records/s and RSS on a "
                                          "multi-GB JSONL vs HF datasets streaming")
    p.add_argument("--gb", type=float, default=2.0,
                   help="GB (10^9 bytes) of JSONL to write and read (default 2)")
    add_inputs(p, corpus="JSONL with 'id' and 'text' fields, repeated to --gb",
               tokenizer="tokenizer.json for --fn tokenize")
    p.add_argument("--fn", choices=FUNCTIONS, default="light",
                   help="the function mapped over the records (default light)")
    p.add_argument("--records", type=int, default=200_000,
                   help="records timed after the first (default 200000)")
    p.add_argument("--workers", type=int, default=2,
                   help="measure 0, 1, ... up to this many processing workers (default 2)")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face datasets")
    add_common(p, repeat=1, repeat_help="rounds of every measurement; the best is reported",
               tmp_dir="where the corpus goes (default: the system temp dir)")
    return p


def write_corpus(source: Path, gb: float, out: Path) -> dict[str, Any]:
    """``source`` repeated (whole copies, written as one block each) until ``gb`` GB."""
    block = source.read_bytes()
    if not block.strip():
        raise ConfigError(f"{source} is empty")
    if not block.endswith(b"\n"):
        block += b"\n"
    target = max(1, int(gb * GB))
    copies = -(-target // len(block))
    with open(out, "wb") as f:
        for _ in range(copies):
            f.write(block)
    return {"path": str(out), "bytes": copies * len(block), "copies": copies,
            "records": copies * block.count(b"\n"), "source": str(source)}


def _rss_mb() -> tuple[float, float]:
    """This process's peak (VmHWM: see :func:`~shardwise.bench.child.memory_mb`) and its
    largest reaped child's (worker processes: ``ru_maxrss`` is all the kernel keeps)."""
    import resource

    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return memory_mb()["peak_mb"], child_kb / 1024


def _child_main(spec: dict[str, Any]) -> None:
    """One measurement, in a fresh interpreter; prints a JSON line."""
    fn = {"light": light, "tokenize": tokenize}[spec["fn"]]
    started = time.perf_counter()
    if spec["reader"] == "hf":
        from datasets import load_dataset

        ds = load_dataset("json", data_files=spec["path"], split="train", streaming=True)
        reader: Any = ds.map(fn)
        close = None
    else:
        from shardwise.read.records.stream import RecordStream

        reader = RecordStream([spec["path"]], map_fn=fn, seed=0,
                              num_workers=spec["workers"])
        close = reader.close
    built = time.perf_counter()
    it = iter(reader)
    next(it)
    first = time.perf_counter()
    for _ in range(spec["records"]):
        next(it)
    done = time.perf_counter()
    if close is not None:
        close()
    rss, worker_rss = _rss_mb()
    print(json.dumps({"start_s": built - started, "first_s": first - started,
                      "seconds": done - first, "records_per_s": spec["records"] / (done - first),
                      "rss_mb": rss, "worker_rss_mb": worker_rss}))


def measure(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    code = ("import sys, json; from shardwise.bench.records import _child_main; "
            "_child_main(json.loads(sys.argv[1]))")
    return run_child(code, json.dumps(spec), env=env, what=f"the {spec['reader']} run")


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(max(runs, key=lambda r: r["records_per_s"]))
    best["first_s"] = min(r["first_s"] for r in runs)
    best["start_s"] = min(r["start_s"] for r in runs)
    best["rss_mb"] = max(r["rss_mb"] for r in runs)
    best["runs_records_per_s"] = [r["records_per_s"] for r in runs]
    return best


def run_rounds(args: argparse.Namespace, corpus: dict[str, Any], env: dict[str, str],
               with_hf: bool, log: Any) -> dict[str, Any]:
    names = (["hf"] if with_hf else []) + [f"w{w}" for w in range(args.workers + 1)]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.repeat):
        for name in names:
            spec = {"reader": "hf" if name == "hf" else "shardwise", "path": corpus["path"],
                    "fn": args.fn, "records": args.records,
                    "workers": 0 if name == "hf" else int(name[1:])}
            runs[name].append(measure(spec, env))
            log(f"  round {r + 1}/{args.repeat}: {name}: "
                f"{runs[name][-1]['records_per_s']:,.0f} records/s")
    report: dict[str, Any] = {"hf": _best(runs["hf"]) if with_hf else None,
                              "shardwise": [dict(_best(runs[n]), workers=int(n[1:]))
                                            for n in names if n != "hf"]}
    if with_hf:
        hf = report["hf"]
        for s in report["shardwise"]:
            s["vs_hf"] = s["records_per_s"] / hf["records_per_s"]
            s["first_vs_hf"] = hf["first_s"] / s["first_s"]
    return report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    sw = report["shardwise"]
    size = report["corpus"]["bytes"] / GB
    first = max(s["first_s"] for s in sw)
    out = [{"what": f"first example < {TARGET_START_S:.0f} s on {size:.1f} GB",
            "want": TARGET_START_S, "got": first, "ok": first < TARGET_START_S},
           {"what": f"RSS < {TARGET_RSS_MB:.0f} MB", "want": TARGET_RSS_MB,
            "got": max(max(s["rss_mb"], s["worker_rss_mb"]) for s in sw)}]
    out[1]["ok"] = out[1]["got"] < TARGET_RSS_MB
    if report["hf"] is not None:
        for s in sw:
            if s["workers"]:
                out.append({"what": f"{s['workers']} worker(s) >= {TARGET_VS_HF:.0f}x HF "
                                    "streaming records/s", "want": TARGET_VS_HF,
                            "got": s["vs_hf"], "ok": s["vs_hf"] >= TARGET_VS_HF})
    return out


def format_report(report: dict[str, Any]) -> str:
    c = report["corpus"]
    lines = [f"shardwise bench records: {c['bytes'] / GB:.2f} GB JSONL, {c['records']:,} "
             f"records ({c['copies']} copies of {c['source']}), fn={report['fn']}, "
             f"{report['records']:,} records timed; best of {report['repeat']}; "
             f"cores {report['cores']}", "",
             f"  {'':<26}{'build s':>9}{'first s':>9}{'records/s':>12}{'vs HF':>8}"
             f"{'RSS MB':>8}{'worker MB':>11}"]
    rows = ([("HF datasets streaming", report["hf"], "1.00x")] if report["hf"] else [])
    for s in report["shardwise"]:
        ratio = f"{s['vs_hf']:.2f}x" if "vs_hf" in s else "-"
        rows.append((f"RecordStream, {s['workers']} worker{'s' * (s['workers'] != 1)}", s,
                     ratio))
    for name, r, ratio in rows:
        worker = f"{r['worker_rss_mb']:.0f}" if r["worker_rss_mb"] else "-"
        lines.append(f"  {name:<26}{r['start_s']:>9.3f}{r['first_s']:>9.3f}"
                     f"{r['records_per_s']:>12,.0f}{ratio:>8}{r['rss_mb']:>8.0f}{worker:>11}")
    if report["hf"] is None:
        lines.append(f"  (HF datasets: {report['hf_note']})")
    lines.append("")
    for t in report["targets"]:
        lines.append(f"  target {t['what']}: {t['got']:.3g} {'ok' if t['ok'] else 'MISSED'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``shardwise bench records``: write the corpus, measure, print (``--json``: a dict)."""
    from shardwise.bench.text_corpus import sample_dir

    if not args.gb > 0:
        raise ConfigError(f"--gb must be positive, got {args.gb}")
    check_counts(args, records=1, workers=0, repeat=1)
    sample = sample_dir()
    source = Path(args.corpus) if args.corpus else (sample / "corpus.jsonl" if sample else None)
    if source is None or not source.is_file():
        raise ConfigError("pass --corpus FILE (a JSONL file with 'id' and 'text' fields): "
                          "the bundled sample is missing from this install")
    with_hf = not args.no_hf and importlib.util.find_spec("datasets") is not None
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-", dir=args.tmp_dir) as tmp:
        started = time.perf_counter()
        corpus = write_corpus(source, args.gb, Path(tmp) / "corpus.jsonl")
        log(f"shardwise bench records: wrote {corpus['bytes'] / GB:.2f} GB in "
            f"{time.perf_counter() - started:.1f} s to {tmp}")
        env = dict(os.environ, HF_HOME=str(Path(tmp) / "hf"), HF_DATASETS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
        tokenizer = args.tokenizer or (sample / "tokenizer.json" if sample else None)
        if args.fn == "tokenize":
            if tokenizer is None or not Path(tokenizer).is_file():
                raise ConfigError("--fn tokenize needs --tokenizer FILE (a tokenizer.json)")
            env["SHARDWISE_BENCH_TOKENIZER"] = str(tokenizer)
        report = run_rounds(args, corpus, env, with_hf, log)
    report.update({"corpus": corpus, "fn": args.fn, "records": args.records,
                   "repeat": args.repeat, "cores": len(os.sched_getaffinity(0))
                   if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                   "hf_note": None if with_hf else ("skipped (--no-hf)" if args.no_hf else
                                                    "not installed: pip install 'shardwise[hf]'")})
    report["targets"] = targets(report)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


__all__ = ["add_subparser", "run"]
