"""``shardwise bench read``: examples/s, time to first example and RSS of the reader, beside
baselines measured in the same run on the same Megatron ``.bin/.idx`` data.

The bench writes two corpora of random uint16 tokens (vocab 50k, every document ending in
the end-of-document id 0) with log-normal document lengths (median 400, mean ~820 tokens,
like web text): ``--tokens`` and ``--large-factor`` times that (for the size-independence
figures). On the small one, an untimed warm-up round, then ``--repeat`` rounds, each
reading the examples ``[0, n)`` (``n = --batches × --micro-batch``) through every path in
turn, the best (shortest) run of each kept: a warm steady state, every page in the page
cache and mapped, so no path pays another's page faults::

    plain numpy   windows sliced from np.memmap into a preallocated [m, L+1] int64 array
    ds[i]         TokenDataset.__getitem__, one example per call
    __getitems__  TokenDataset.__getitems__, one micro-batch per call
    loader        shardwise.torch.loader(num_workers=0)
    megatron      megatron.core GPTDataset + torch DataLoader(batch_size=m, num_workers=0)

The plain-numpy windows are the dataset's own (``ds.windows``), so its rows must equal the
shardwise ``input_ids``/``labels``; that is checked before timing. Start-up and RSS are
measured in fresh interpreters (``python -c``), seek in this process.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError

VOCAB = 50_000
EOD = 0
DATA_VERSION = 1
MEGATRON_INSTALL = "pip install --no-deps megatron-core==0.16.1"
CLOCKS = {"wall": "perf_counter", "cpu": "process_time"}
RSS_NOTE = ("peak RSS counts mapped page-cache pages (the kernel maps up to 64 KB around each "
            "touched page), for plain numpy too; the reader's own memory is the heap row")
TARGETS = {"loader_vs_megatron": 5.0, "loader_vs_numpy": 0.5, "first_example_s": 0.050,
           "import_s": 0.3, "seek_s": 0.010}


def add_read_parser(which: Any) -> argparse.ArgumentParser:
    """The ``read`` subcommand of ``shardwise bench``."""
    r = which.add_parser("read", help="examples/s, time to first example and RSS of the "
                                      "reader vs plain numpy and Megatron's GPTDataset")
    r.add_argument("--tokens", type=int, default=50_000_000,
                   help="tokens of the main corpus (default 50M)")
    r.add_argument("--large-factor", type=int, default=4,
                   help="the second corpus is this many times larger (default 4)")
    r.add_argument("--seq-len", type=int, default=2048)
    r.add_argument("--micro-batch", type=int, default=8)
    r.add_argument("--batches", type=int, default=200,
                   help="micro-batches per timed run (default 200)")
    r.add_argument("--rss-batches", type=int, default=500,
                   help="micro-batches read by the RSS processes (default 500)")
    r.add_argument("--repeat", type=int, default=5, help="best of N runs (default 5)")
    r.add_argument("--seed", type=int, default=1234)
    r.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time, or this process's CPU time (steadier on a loaded "
                        "machine; I/O waits not counted) (default wall)")
    r.add_argument("--dir", default=None, metavar="DIR",
                   help="keep the data here and reuse it (default: a temp dir, removed)")
    r.add_argument("--no-megatron", action="store_true",
                   help="skip the Megatron-Core baseline")
    r.add_argument("--json", action="store_true")
    return r


# -- data -------------------------------------------------------------------------------
def doc_lengths(tokens: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Log-normal document lengths (median 400) in [16, 65536], summing to ``tokens``."""
    parts, total = [], 0
    while total < tokens:
        x = np.clip(np.rint(rng.lognormal(np.log(400), 1.2, 65_536)), 16, 65_536)
        parts.append(x.astype(np.int64))
        total += int(parts[-1].sum())
    lengths = np.concatenate(parts)
    last = int(np.searchsorted(np.cumsum(lengths), tokens))
    lengths = lengths[: last + 1]
    lengths[-1] -= int(lengths.sum()) - tokens
    return lengths


def make_corpus(prefix: Path, tokens: int, seed: int) -> dict[str, Any]:
    """Write ``prefix.bin/.idx`` (reused when its ``.json`` says it was made alike)."""
    from shardwise.format.megatron import idx_bytes

    meta_path = prefix.with_name(prefix.name + ".json")
    want = {"version": DATA_VERSION, "tokens": tokens, "seed": seed, "vocab": VOCAB}
    bin_path = prefix.with_name(prefix.name + ".bin")
    if meta_path.is_file() and bin_path.is_file() and bin_path.stat().st_size == 2 * tokens:
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in want} == want:
            return {**meta, "made_s": 0.0, "reused": True}
    meta_path.unlink(missing_ok=True)  # written last: its presence means complete files
    started = time.perf_counter()
    rng = np.random.default_rng([seed, tokens])
    lengths = doc_lengths(tokens, rng)
    ends = np.cumsum(lengths) - 1
    block = 1 << 24
    with open(bin_path, "wb") as f:
        for s in range(0, tokens, block):
            ids = rng.integers(1, VOCAB, size=min(block, tokens - s), dtype=np.uint16)
            e = ends[(ends >= s) & (ends < s + len(ids))] - s
            ids[e] = EOD
            f.write(ids.tobytes())
    prefix.with_name(prefix.name + ".idx").write_bytes(idx_bytes(lengths, np.uint16))
    meta = {**want, "prefix": str(prefix), "documents": len(lengths),
            "mean_doc": float(lengths.mean()), "median_doc": float(np.median(lengths))}
    meta_path.write_text(json.dumps(meta))
    return {**meta, "made_s": time.perf_counter() - started, "reused": False}


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


def check_identical(ds: Any, mm: npt.NDArray[Any], args: argparse.Namespace,
                    make_loader: Callable[[int], Any] | None) -> dict[str, Any]:
    """The first micro-batches through every shardwise path vs plain-numpy slicing."""
    L, m = args.seq_len, args.micro_batch
    k = min(args.batches, 8)
    ok = {"getitem": True, "getitems": True, "loader": None, "batches": k}
    batches = iter(make_loader(0)) if make_loader is not None else None
    for b in range(k):
        idx = list(range(b * m, (b + 1) * m))
        rows = np.stack([np.asarray(mm[w * L: w * L + L + 1], dtype=np.int64)
                         for w in ds.windows(idx).tolist()])
        got = ds.__getitems__(idx)
        ok["getitems"] &= bool(np.array_equal(got["input_ids"], rows[:, :L])
                               and np.array_equal(got["labels"], rows[:, 1:]))
        ok["getitem"] &= all(np.array_equal(ds[i]["input_ids"], rows[j, :L])
                             and np.array_equal(ds[i]["labels"], rows[j, 1:])
                             for j, i in enumerate(idx))
        if batches is not None:
            t = next(batches)
            ok["loader"] = (ok["loader"] is not False
                            and np.array_equal(t["input_ids"].numpy(), rows[:, :L])
                            and np.array_equal(t["labels"].numpy(), rows[:, 1:]))
    ok["all"] = all(v is not False for v in ok.values())
    return ok


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Megatron-Core warns and logs at import and construction; keep the report clean."""
    level = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(level)


def megatron_dataset(prefix: Path, args: argparse.Namespace, cache_dir: Path
                     ) -> tuple[Any, dict[str, Any]]:
    """Megatron-Core's GPTDataset over ``prefix`` (None and a note when unavailable)."""
    info: dict[str, Any] = {"available": False}
    try:
        with _quiet():
            from importlib.metadata import version

            from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
            from megatron.core.datasets.indexed_dataset import IndexedDataset
            from megatron.core.datasets.utils import Split
            info["version"] = version("megatron-core")
    except Exception as e:  # ImportError, or a broken install raising anything else
        info["note"] = (f"megatron.core is not importable ({type(e).__name__}: {e}); "
                        f"for the baseline: {MEGATRON_INSTALL}")
        return None, info

    class StubTokenizer:  # what GPTDataset reads of a tokenizer
        eod, pad, vocab_size = EOD, VOCAB + 1, VOCAB
        unique_identifiers = {"class": "StubTokenizer", "eod": EOD, "pad": VOCAB + 1}

    try:
        with _quiet():
            config = GPTDatasetConfig(
                random_seed=args.seed, sequence_length=args.seq_len, blend=None,
                split="1,0,0", tokenizer=StubTokenizer(), reset_position_ids=False,
                reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
                path_to_cache=str(cache_dir), mmap_bin_files=True)
            started = time.perf_counter()
            low = IndexedDataset(str(prefix), multimodal=False, mmap=True)
            docs = np.arange(len(low.sequence_lengths), dtype=np.int32)
            ds = GPTDataset(low, str(prefix), docs, None, Split.train, config)
            info["index_build_s"] = time.perf_counter() - started
            ds[0]  # warm up (lazy loads), as check_identical does for shardwise
    except Exception as e:  # an incompatible megatron-core version
        info["note"] = (f"megatron-core {info['version']} GPTDataset failed "
                        f"({type(e).__name__}: {e}); the bench targets {MEGATRON_INSTALL}")
        return None, info
    info.update(available=True, examples=len(ds), note="GPTDataset(create_attention_mask="
                "False): tokens, labels, loss_mask, position_ids, as shardwise returns")
    return ds, info


def _drain(items: Any) -> None:
    """Consume an iterable, keeping nothing (each batch is freed before the next)."""
    collections.deque(items, maxlen=0)


def one_round(ds: Any, mm: npt.NDArray[Any], args: argparse.Namespace,
              make_loader: Callable[[int], Any] | None, meg: Any) -> dict[str, float]:
    """Seconds of each read path over examples ``[0, batches·m)``."""
    L, m, nb, c = args.seq_len, args.micro_batch, args.batches, args.clock
    n = nb * m
    windows = ds.windows(np.arange(n)).reshape(nb, m) * L
    idx = [list(range(k * m, (k + 1) * m)) for k in range(nb)]
    out = {"numpy": _timed(_numpy_run(mm, windows.tolist(), L), c),
           "getitem": _timed(lambda: _drain(ds[i] for i in range(n)), c),
           "getitems": _timed(lambda: _drain(ds.__getitems__(i) for i in idx), c)}
    if make_loader is not None:
        dl = make_loader(0)
        out["loader"] = _timed(lambda: _drain(itertools.islice(dl, nb)), c)
    if meg is not None:
        from torch.utils.data import DataLoader

        sampler = [i % len(meg) for i in range(n)]
        mdl = DataLoader(meg, batch_size=m, sampler=sampler, num_workers=0)
        with _quiet():
            out["megatron"] = _timed(lambda: _drain(mdl), c)
    return out


def measure_throughput(ds: Any, mm: npt.NDArray[Any], args: argparse.Namespace,
                       make_loader: Callable[[int], Any] | None, meg: Any,
                       log: Callable[[str], None]) -> dict[str, Any]:
    """Interleaved rounds of every read path over the same examples; best run of each."""
    n = args.batches * args.micro_batch
    runs: dict[str, list[float]] = {}
    one_round(ds, mm, args, make_loader, meg)  # warm-up: map the pages every path reads
    for r in range(args.repeat):
        for k, v in one_round(ds, mm, args, make_loader, meg).items():
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


def measure_seek(prefix: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Loader construction plus its first batch, deep in the data (epoch 3) vs at 0."""
    from shardwise import TokenDataset, World, open_cache
    from shardwise.torch import loader

    m, now = args.micro_batch, getattr(time, CLOCKS[args.clock])
    probe = TokenDataset(open_cache(prefix), seq_len=args.seq_len, seed=args.seed)
    deep = (3 * len(probe) + len(probe) // 2) // m * m
    out: dict[str, Any] = {"consumed": deep}
    for name, consumed in (("zero", 0), ("deep", deep)):
        best = float("inf")
        for _ in range(args.repeat):
            ds = TokenDataset(open_cache(prefix), seq_len=args.seq_len, seed=args.seed)
            started = now()
            next(iter(loader(ds, global_batch_size=m, micro_batch_size=m, world=World(0, 1),
                             num_workers=0, consumed=consumed)))
            best = min(best, now() - started)
        out[name] = best
    return out


# -- fresh interpreters -----------------------------------------------------------------
IMPORT_CODE = """
import json, sys, time
t = time.perf_counter()
import {module}
print(json.dumps({{"seconds": time.perf_counter() - t, "torch": "torch" in sys.modules}}))
"""
FIRST_CODE = """
import json, sys, time
import shardwise
prefix, seq_len, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = time.perf_counter()
ds = shardwise.TokenDataset(shardwise.open_cache(prefix), seq_len=seq_len, seed=seed)
ds[0]
print(json.dumps({"seconds": time.perf_counter() - t, "torch": "torch" in sys.modules}))
"""
FIRST_NUMPY_CODE = """
import json, sys, time
import numpy as np
prefix, seq_len = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
mm = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
np.array(mm[: seq_len + 1], dtype=np.int64)
print(json.dumps({"seconds": time.perf_counter() - t}))
"""
# /proc/self/status, not ru_maxrss: on Linux a spawned child's ru_maxrss starts at its
# parent's RSS. VmHWM is the peak; RssAnon (heap) and RssFile (mapped file pages: the
# kernel maps page-cache neighbours of each touched page) are read at the end.
_MEM = """
def mem_mb():
    try:
        with open("/proc/self/status") as f:
            kb = {k: int(v.split()[0]) for k, v in (x.split(":", 1) for x in f)
                  if k in ("VmHWM", "RssAnon", "RssFile")}
        return {"peak_mb": kb["VmHWM"] / 1024, "anon_mb": kb["RssAnon"] / 1024,
                "file_mb": kb["RssFile"] / 1024}
    except (OSError, KeyError):
        import resource
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_mb": kb / 1024 / (1024 if sys.platform == "darwin" else 1)}
"""
RSS_CODE = "import json, sys\n" + _MEM + """
import shardwise
prefix, seq_len, seed, m, nb = sys.argv[1], *map(int, sys.argv[2:6])
before = mem_mb()
ds = shardwise.TokenDataset(shardwise.open_cache(prefix), seq_len=seq_len, seed=seed)
for k in range(nb):
    ds.__getitems__(list(range(k * m, (k + 1) * m)))
print(json.dumps({**mem_mb(), "after_import": before}))
"""
RSS_NUMPY_CODE = "import json, sys\n" + _MEM + """
import numpy as np
prefix, seq_len, m, windows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
before = mem_mb()
starts = (np.load(windows) * seq_len).reshape(-1, m).tolist()
mm = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
out = np.empty((m, seq_len + 1), dtype=np.int64)
for batch in starts:
    for r, s in enumerate(batch):
        out[r] = mm[s : s + seq_len + 1]
print(json.dumps({**mem_mb(), "after_import": before}))
"""


def probe(code: str, *argv: object, clock: str = "wall") -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its last line of output, parsed as JSON."""
    code = code.replace("time.perf_counter()", f"time.{CLOCKS[clock]}()")
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, argv)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"a bench process failed (exit {proc.returncode}):\n"
                          f"{proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def best_probe(args: argparse.Namespace, code: str, *argv: object, warm: bool = False
               ) -> dict[str, Any]:
    """The fastest of ``--repeat`` runs (after one unmeasured run when ``warm``)."""
    if warm:
        probe(code, *argv)
    runs = [probe(code, *argv, clock=args.clock) for _ in range(args.repeat)]
    best = min(runs, key=lambda x: x["seconds"])
    return {**best, "runs": [x["seconds"] for x in runs]}


def measure_startup(small: Path, large: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Import and first-example times, each in fresh interpreters (best of ``--repeat``)."""
    out = {"import": best_probe(args, IMPORT_CODE.format(module="shardwise")),
           "import_numpy": best_probe(args, IMPORT_CODE.format(module="numpy"))}
    for name, prefix in (("small", small), ("large", large)):
        out[f"first_{name}"] = best_probe(args, FIRST_CODE, prefix, args.seq_len, args.seed,
                                          warm=True)
        out[f"first_numpy_{name}"] = best_probe(args, FIRST_NUMPY_CODE, prefix, args.seq_len,
                                                warm=True)
    return out


def measure_rss(small: Path, large: Path, args: argparse.Namespace, work: Path
                ) -> dict[str, Any]:
    """Peak RSS of fresh processes reading ``--rss-batches`` micro-batches of each corpus."""
    from shardwise import TokenDataset, open_cache

    m, nb = args.micro_batch, args.rss_batches
    out: dict[str, Any] = {"batches": nb}
    for name, prefix in (("small", small), ("large", large)):
        out[name] = probe(RSS_CODE, prefix, args.seq_len, args.seed, m, nb)
        ds = TokenDataset(open_cache(prefix), seq_len=args.seq_len, seed=args.seed)
        windows = work / f"{name}.windows.npy"
        np.save(windows, ds.windows(np.arange(nb * m)))
        out[f"numpy_{name}"] = probe(RSS_NUMPY_CODE, prefix, args.seq_len, m, windows)
    return out


# -- report -----------------------------------------------------------------------------
def _row(what: str, value: float | None, unit: str, base_what: str, base: float | None
         ) -> dict[str, Any]:
    ratio = value / base if value is not None and base else None
    return {"what": what, "value": value, "unit": unit, "baseline_what": base_what,
            "baseline": base, "ratio": ratio}


def figure_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure beside its baseline (ratio = figure / baseline)."""
    tp, st, rss, cfg = rep["throughput"], rep["startup"], rep["rss"], rep["config"]
    eps = {k: v["examples_per_s"] for k, v in tp.items()}
    meg = eps.get("megatron")
    np_name = "plain numpy memmap slicing"
    rows = [_row("ds[i], one example per call", eps["getitem"], "ex/s", np_name, eps["numpy"]),
            _row("ds.__getitems__, one micro-batch", eps["getitems"], "ex/s", np_name,
                 eps["numpy"])]
    if "loader" in eps:
        rows += [_row("loader, num_workers=0", eps["loader"], "ex/s", np_name, eps["numpy"]),
                 _row("loader, num_workers=0", eps["loader"], "ex/s",
                      "Megatron GPTDataset + DataLoader", meg)]
    if meg is not None:
        rows.append(_row("Megatron GPTDataset + DataLoader", meg, "ex/s", np_name, eps["numpy"]))
    small, large = f"{cfg['tokens'] / 1e6:g}M", f"{cfg['large_tokens'] / 1e6:g}M"
    rows += [_row("import shardwise (fresh process)", st["import"]["seconds"], "s",
                  "import numpy", st["import_numpy"]["seconds"]),
             _row(f"first example, {small} tokens", st["first_small"]["seconds"], "s",
                  "np.memmap + first window", st["first_numpy_small"]["seconds"]),
             _row(f"first example, {large} tokens", st["first_large"]["seconds"], "s",
                  f"first example, {small} tokens", st["first_small"]["seconds"])]
    if "seek" in rep:
        rows.append(_row(f"loader + first batch at example {rep['seek']['consumed']:,}",
                         rep["seek"]["deep"], "s", "at example 0", rep["seek"]["zero"]))
    for kind, key in (("peak RSS", "peak_mb"), ("heap (RssAnon)", "anon_mb")):
        if key not in rss["small"]:
            continue
        rows += [_row(f"{kind}, {small} tokens", rss["small"][key], "MB",
                      "plain numpy, same windows", rss["numpy_small"][key]),
                 _row(f"{kind}, {large} tokens", rss["large"][key], "MB",
                      "plain numpy, same windows", rss["numpy_large"][key]),
                 _row(f"{kind}, {large} vs {small} tokens", rss["large"][key], "MB",
                      f"{kind}, {small} tokens", rss["small"][key])]
    return rows


def targets(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's acceptance figures, checked against this run (None: not measured)."""
    tp, st = rep["throughput"], rep["startup"]
    loader = tp.get("loader", {}).get("examples_per_s")
    meg = tp.get("megatron", {}).get("examples_per_s")
    first = max(st["first_small"]["seconds"], st["first_large"]["seconds"])
    t = TARGETS
    out = [
        {"what": f"loader >= {t['loader_vs_megatron']:g}x Megatron GPTDataset", "op": ">=",
         "want": t["loader_vs_megatron"], "got": loader / meg if loader and meg else None},
        {"what": f"loader >= {t['loader_vs_numpy']:.0%} of plain numpy", "op": ">=",
         "want": t["loader_vs_numpy"],
         "got": loader / tp["numpy"]["examples_per_s"] if loader else None},
        {"what": f"first example < {t['first_example_s'] * 1e3:g} ms, both sizes", "op": "<",
         "want": t["first_example_s"], "got": first},
        {"what": f"import shardwise < {t['import_s']:g} s", "op": "<", "want": t["import_s"],
         "got": st["import"]["seconds"]},
        {"what": f"seek < {t['seek_s'] * 1e3:g} ms", "op": "<", "want": t["seek_s"],
         "got": rep["seek"]["deep"] if "seek" in rep else None},
    ]
    for x in out:
        got = x["got"]
        x["ok"] = None if got is None else (got >= x["want"] if x["op"] == ">=" else
                                            got < x["want"])
    return out


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ex/s":
        return f"{value:,.0f} ex/s"
    if unit == "s":
        return f"{value * 1e3:,.1f} ms"
    return f"{value:,.1f} {unit}"


def format_report(rep: dict[str, Any]) -> str:
    cfg, data = rep["config"], rep["data"]
    tp = rep["throughput"]
    lines = [
        f"shardwise bench read: Megatron .bin/.idx of {cfg['tokens']:,} tokens "
        f"({data['small']['documents']:,} documents, mean {data['small']['mean_doc']:.0f}) "
        f"and {cfg['large_tokens']:,}; uint16, vocab {VOCAB:,}",
        f"  seq_len {cfg['seq_len']}, micro-batch {cfg['micro_batch']}, window shuffle, one "
        f"process; {cfg['batches']} micro-batches per run, best of {cfg['repeat']}, "
        f"{cfg['clock']} clock",
        "",
        f"  {'figure':<44}{'value':>16}   {'baseline':<34}{'value':>16}{'ratio':>9}",
    ]
    for r in rep["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"  {r['what']:<44}{_fmt(r['value'], r['unit']):>16}   "
                     f"{r['baseline_what']:<34}{_fmt(r['baseline'], r['unit']):>16}"
                     f"{ratio:>9}")
    if "loader" in tp:
        lo = tp["loader"]
        lines.append(f"  loader: {lo['batches_per_s']:,.0f} micro-batches/s, "
                     f"{lo['tokens_per_s'] / 1e6:,.1f} M tokens/s")
    lines += [f"  note: {n}" for n in rep["notes"]]
    ident = rep["identical"]
    lines += ["", f"  identical to plain numpy ({ident['batches']} micro-batches): "
                  + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ident.items()
                              if k not in ("batches", "all") and v is not None)]
    for tg in rep["targets"]:
        got = tg["got"]
        status = "not measured" if got is None else ("ok" if tg["ok"] else "MISSED")
        shown = "-" if got is None else (f"{got:.2f}x" if tg["op"] == ">=" else
                                         f"{got * 1e3:.1f} ms")
        lines.append(f"  target {tg['what']}: {shown} {status}")
    return "\n".join(lines)


def _check_args(args: argparse.Namespace) -> None:
    for name in ("tokens", "large_factor", "seq_len", "micro_batch", "batches", "rss_batches",
                 "repeat"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, "
                              f"got {getattr(args, name)}")
    if args.tokens < 2 * (args.seq_len + 1):
        raise ConfigError(f"--tokens {args.tokens} holds under two windows of --seq-len "
                          f"{args.seq_len} + 1; give more tokens")


def _torch_loader(ds: Any, m: int) -> tuple[Callable[[int], Any] | None, str | None]:
    try:
        from shardwise import World
        from shardwise.torch import loader
    except ImportError as e:  # MissingExtraError is an ImportError too
        return None, f"no loader, seek or Megatron figures: {e}"

    def make(consumed: int) -> Any:
        return loader(ds, global_batch_size=m, micro_batch_size=m, world=World(0, 1),
                      num_workers=0, consumed=consumed)
    return make, None


def run_read_bench(args: argparse.Namespace) -> int:
    """``shardwise bench read``: make the data, measure, print (``--json``: a dict)."""
    _check_args(args)
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    with contextlib.ExitStack() as stack:
        work = (Path(args.dir) if args.dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="shardwise-bench-read-"))))
        work.mkdir(parents=True, exist_ok=True)
        large_tokens = args.tokens * args.large_factor
        small, large = work / f"tokens-{args.tokens}", work / f"tokens-{large_tokens}"
        log(f"shardwise bench read: writing data in {work}")
        data = {"small": make_corpus(small, args.tokens, args.seed),
                "large": make_corpus(large, large_tokens, args.seed)}
        rep: dict[str, Any] = {"config": {**{k: v for k, v in vars(args).items()
                                             if not k.startswith("_")},
                                          "large_tokens": large_tokens},
                               "data": data, "notes": [RSS_NOTE]}
        from shardwise import TokenDataset, open_cache

        ds = TokenDataset(open_cache(small), seq_len=args.seq_len, seed=args.seed)
        mm = np.memmap(small.with_name(small.name + ".bin"), dtype=np.uint16, mode="r")
        make_loader, note = _torch_loader(ds, args.micro_batch)
        meg = None
        if note:
            rep["notes"].append(note)
        elif args.no_megatron:
            rep["megatron"] = {"available": False, "note": "skipped (--no-megatron)"}
        else:
            meg, rep["megatron"] = megatron_dataset(
                small, args, Path(stack.enter_context(tempfile.TemporaryDirectory(dir=work))))
        if rep.get("megatron", {}).get("note"):
            rep["notes"].append(f"Megatron: {rep['megatron']['note']}")
        rep["identical"] = check_identical(ds, mm, args, make_loader)
        log("  measuring throughput")
        rep["throughput"] = measure_throughput(ds, mm, args, make_loader, meg, log)
        if make_loader is not None:
            rep["seek"] = measure_seek(small, args)
        log("  measuring start-up and RSS in fresh processes")
        rep["startup"] = measure_startup(small, large, args)
        rep["rss"] = measure_rss(small, large, args, work)
    rep["rows"] = figure_rows(rep)
    rep["targets"] = targets(rep)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0 if rep["identical"]["all"] else 1


__all__ = ["add_read_parser", "run_read_bench"]
