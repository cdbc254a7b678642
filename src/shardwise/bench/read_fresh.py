"""Figures of ``shardwise bench read`` that only a fresh interpreter shows honestly.

Import time, time to first example (window shuffle: nothing to plan; document shuffle:
with its plan built from scratch, *cold*, and loaded from the ``.npy`` files a previous
start left, *cached*) and peak RSS, each in a new ``python -c`` process beside a plain
numpy process doing the same, so nothing this process has imported, mapped or cached
helps.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.bench.child import MEMORY_CODE, child_env, run_child

CLOCKS = {"wall": "perf_counter", "cpu": "process_time"}


def add_megatron_options(p: argparse.ArgumentParser, *, keep: str) -> None:
    """``--clock``, ``--dir`` (``keep``: what it keeps) and ``--no-megatron``: the options
    of every bench that times fresh processes beside Megatron-Core."""
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time, or the process's CPU time (steadier on a loaded machine; "
                        "I/O waits not counted) (default wall)")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help=f"keep {keep} here and reuse it (default: a temp dir, removed)")
    p.add_argument("--no-megatron", action="store_true",
                   help="skip the Megatron-Core baseline")

IMPORT_CODE = """
import json, sys, time
t = time.perf_counter()
import {module}
print(json.dumps({{"seconds": time.perf_counter() - t, "torch": "torch" in sys.modules}}))
"""
FIRST_CODE = """
import json, sys, time
import shardwise
prefix, seq_len, seed, shuffle, plan_dir = sys.argv[1:6]
t = time.perf_counter()
ds = shardwise.TokenDataset(shardwise.open_cache(prefix), seq_len=int(seq_len),
                            seed=int(seed), shuffle=shuffle, plan_dir=plan_dir or None)
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
RSS_CODE = "import json, sys\n" + MEMORY_CODE + """
import shardwise
prefix, seq_len, seed, m, nb = sys.argv[1], *map(int, sys.argv[2:6])
before = memory_mb()
ds = shardwise.TokenDataset(shardwise.open_cache(prefix), seq_len=seq_len, seed=seed)
for k in range(nb):
    ds.__getitems__(list(range(k * m, (k + 1) * m)))
print(json.dumps({**memory_mb(), "after_import": before}))
"""
RSS_NUMPY_CODE = "import json, sys\n" + MEMORY_CODE + """
import numpy as np
prefix, seq_len, m, windows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
before = memory_mb()
starts = (np.load(windows) * seq_len).reshape(-1, m).tolist()
mm = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
out = np.empty((m, seq_len + 1), dtype=np.int64)
for batch in starts:
    for r, s in enumerate(batch):
        out[r] = mm[s : s + seq_len + 1]
print(json.dumps({**memory_mb(), "after_import": before}))
"""


MEGATRON_FIRST_CODE = """
import json, sys, time
from pathlib import Path
from shardwise.bench.read_data import megatron_dataset
prefix, seq_len, seed, cache_dir = sys.argv[1:5]
ds, info = megatron_dataset(Path(prefix), int(seq_len), int(seed), Path(cache_dir),
                            now=lambda: time.perf_counter())
if ds is None:
    raise SystemExit(info["note"])
print(json.dumps({"seconds": info["first_example_s"]}))
"""
MEGATRON_RSS_CODE = "import json, sys\n" + MEMORY_CODE + """
from pathlib import Path
from shardwise.bench.read_data import megatron_dataset, quiet
with quiet():  # its imports (torch among them) count before, as shardwise's import does
    import megatron.core.datasets.gpt_dataset
prefix, seq_len, seed, m, nb, cache_dir = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
before = memory_mb()
ds, info = megatron_dataset(Path(prefix), seq_len, seed, Path(cache_dir))
if ds is None:
    raise SystemExit(info["note"])
for i in range(m * nb):
    ds[i % len(ds)]
print(json.dumps({**memory_mb(), "after_import": before}))
"""


def probe(code: str, *argv: object, clock: str = "wall") -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its last line of output, parsed as JSON."""
    code = code.replace("time.perf_counter()", f"time.{CLOCKS[clock]}()")
    return run_child(code, *argv, env=child_env())


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(runs, key=lambda x: x["seconds"])
    return {**best, "runs": [x["seconds"] for x in runs]}


def best_probe(args: argparse.Namespace, code: str, *argv: object, warm: bool = False
               ) -> dict[str, Any]:
    """The fastest of ``--repeat`` runs (after one unmeasured run when ``warm``)."""
    if warm:
        probe(code, *argv)
    return _best([probe(code, *argv, clock=args.clock) for _ in range(args.repeat)])


def cold_and_cached(code: str, argv: tuple[object, ...], args: argparse.Namespace,
                    plans: Path) -> dict[str, Any]:
    """First example of ``code`` (which takes a plan directory as its last argument):
    ``cold`` plans everything (a new, empty plan directory each run), ``cached`` starts
    where a previous start left its plan."""
    cold = []
    for i in range(args.repeat):
        fresh = plans / f"cold-{i}"
        shutil.rmtree(fresh, ignore_errors=True)
        cold.append(probe(code, *argv, fresh, clock=args.clock))
        shutil.rmtree(fresh, ignore_errors=True)
    return {"cold": _best(cold),
            "cached": best_probe(args, code, *argv, plans / "cached", warm=True)}


def measure_startup(small: Path, large: Path, args: argparse.Namespace, work: Path,
                    megatron: bool) -> dict[str, Any]:
    """Import and first-example times, each in fresh interpreters (best of ``--repeat``):
    shardwise's window and document shuffles and, with ``megatron``, GPTDataset."""
    out = {"import": best_probe(args, IMPORT_CODE.format(module="shardwise")),
           "import_numpy": best_probe(args, IMPORT_CODE.format(module="numpy"))}
    for name, prefix in (("small", small), ("large", large)):
        out[f"first_{name}"] = best_probe(args, FIRST_CODE, prefix, args.seq_len, args.seed,
                                          "window", "", warm=True)
        out[f"first_numpy_{name}"] = best_probe(args, FIRST_NUMPY_CODE, prefix, args.seq_len,
                                                warm=True)
        doc = cold_and_cached(FIRST_CODE, (prefix, args.seq_len, args.seed, "document"), args,
                              work / f"plans-{name}")
        out[f"doc_cold_{name}"], out[f"doc_cached_{name}"] = doc["cold"], doc["cached"]
        if megatron:
            meg = cold_and_cached(MEGATRON_FIRST_CODE, (prefix, args.seq_len, args.seed), args,
                                  work / f"megatron-index-{name}")
            out[f"megatron_cold_{name}"] = meg["cold"]
            out[f"megatron_cached_{name}"] = meg["cached"]
    return out


def measure_rss(small: Path, large: Path, args: argparse.Namespace, work: Path,
                megatron: bool) -> dict[str, Any]:
    """Peak RSS of fresh processes reading ``--rss-batches`` micro-batches of each corpus
    (shardwise, plain numpy and, with ``megatron``, GPTDataset with its index cached)."""
    from shardwise import TokenDataset, open_cache

    m, nb = args.micro_batch, args.rss_batches
    out: dict[str, Any] = {"batches": nb}
    for name, prefix in (("small", small), ("large", large)):
        out[name] = probe(RSS_CODE, prefix, args.seq_len, args.seed, m, nb)
        ds = TokenDataset(open_cache(prefix), seq_len=args.seq_len, seed=args.seed)
        windows = work / f"{name}.windows.npy"
        np.save(windows, ds.windows(np.arange(nb * m)))
        out[f"numpy_{name}"] = probe(RSS_NUMPY_CODE, prefix, args.seq_len, m, windows)
        if megatron:
            out[f"megatron_{name}"] = probe(MEGATRON_RSS_CODE, prefix, args.seq_len, args.seed,
                                            m, nb, work / f"megatron-index-{name}" / "cached")
    return out


__all__ = ["CLOCKS", "add_megatron_options", "best_probe", "cold_and_cached", "measure_rss",
           "measure_startup", "probe"]
