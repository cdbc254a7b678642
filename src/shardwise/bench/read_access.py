"""Random access beside consecutive access, for every order, in one run.

A plain ``DataLoader(ds, shuffle=True)``, a framework's own sampler or an eval subset asks
a map-style dataset for examples at random; shardwise's own loader asks for consecutive
ones. Each order is read both ways, through ``__getitems__`` (a micro-batch per call) and
``ds[i]`` (one example per call), beside Megatron-Core's GPTDataset asked the same
indices. The loader (consecutive batches, ``num_workers=0``) is timed alongside.

Each round runs in a fresh interpreter (:func:`~shardwise.bench.child.run_child`) using
only the public API, so ``--baseline-src DIR`` (another checkout's ``src``, e.g. a
worktree at main) is measured in the same run, its rounds interleaved with this one's:
its figures are the *before* of a change, on the same data and the same machine load.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.bench.child import child_env, run_child
from shardwise.bench.read_fresh import CLOCKS

ORDERS = ("none", "window", "block", "document")
ACCESS_CODE = """
import json, sys, time
import numpy as np
import shardwise
prefix, seq_len, seed, m, nb, orders, clock = sys.argv[1:8]
seq_len, seed, m, nb = int(seq_len), int(seed), int(m), int(nb)
now = getattr(time, clock)
def timed(fn, batches):
    best = None
    for _ in range(2):  # the first pass maps the pages it touches: the second is timed too
        t = now()
        for b in batches:
            fn(b)
        s = now() - t
        best = s if best is None else min(best, s)
    return best
out = {}
for order in orders.split(","):
    ds = shardwise.TokenDataset(shardwise.open_cache(prefix), seq_len=seq_len, seed=seed,
                                shuffle=order)
    n = len(ds)
    cons = [list(range(k * m, (k + 1) * m)) for k in range(nb)]
    rnd = np.random.default_rng(seed).permutation(n)[: nb * m].reshape(nb, m).tolist()
    one = lambda b: [ds[i] for i in b]
    few = max(1, nb // 2)
    out[order] = {"getitems_consecutive": timed(ds.__getitems__, cons),
                  "getitems_random": timed(ds.__getitems__, rnd),
                  "getitem_consecutive": timed(one, cons[:few]) * nb / few,
                  "getitem_random": timed(one, rnd[:few]) * nb / few}
    try:
        from shardwise.torch import loader
    except ImportError:
        continue
    dl = loader(ds, global_batch_size=m, micro_batch_size=m, world=shardwise.World(0, 1),
                num_workers=0)
    it = iter(dl)
    next(it)
    out[order]["loader"] = timed(lambda b: next(it), range(nb))  # as steady: best of two
print(json.dumps(out))
"""


def _megatron_access(meg: Any, m: int, nb: int, seed: int, clock: str) -> dict[str, float]:
    """Seconds of ``nb`` micro-batches of ``meg[i]`` at consecutive and random indices."""
    import time

    now = getattr(time, CLOCKS[clock])
    from shardwise.bench.read_data import quiet

    cons = [list(range(k * m, (k + 1) * m)) for k in range(nb)]
    rnd = np.random.default_rng(seed).permutation(len(meg))[: nb * m].reshape(nb, m).tolist()
    out = {}
    with quiet():
        for name, batches in (("consecutive", cons), ("random", rnd)):
            [meg[i] for i in batches[0]]
            t = now()
            for b in batches:
                [meg[i] for i in b]
            out[f"getitem_{name}"] = now() - t
    return out


def measure_access(prefix: Path, args: Any, meg: Any, log: Callable[[str], None]
                   ) -> dict[str, Any]:
    """Examples/s of every order read at random and consecutively (best of
    ``--repeat`` rounds), for this checkout and each ``--baseline-src`` (its rounds
    interleaved with this checkout's)."""
    m, nb = args.micro_batch, args.batches
    srcs: dict[str, str | None] = {}
    for given in getattr(args, "baseline_src", None) or []:
        label, _, tree = str(given).rpartition("=")
        srcs[label or "before"] = tree
    srcs["after"] = None
    best: dict[str, dict[str, dict[str, float]]] = {}
    for r in range(args.repeat):
        for label, src in srcs.items():
            env = child_env() if src is None else {**os.environ, "PYTHONPATH": src}
            got = run_child(ACCESS_CODE, prefix, args.seq_len, args.seed, m, nb,
                            ",".join(ORDERS), CLOCKS[args.clock], env=env,
                            what=f"the access bench ({label})")
            for order, secs in got.items():
                mine = best.setdefault(label, {}).setdefault(order, {})
                for k, v in secs.items():
                    mine[k] = min(v, mine.get(k, v))
        if meg is not None:
            for k, v in _megatron_access(meg, m, nb, args.seed, args.clock).items():
                mg = best.setdefault("megatron", {}).setdefault("megatron", {})
                mg[k] = min(v, mg.get(k, v))
        log(f"  access round {r + 1}/{args.repeat}")
    n = m * nb
    return {label: {order: {k: n / v for k, v in secs.items()} for order, secs in per.items()}
            for label, per in best.items()}


def access_lines(acc: dict[str, Any]) -> list[str]:
    """The access figures as text: per order, random / consecutive (ex/s and ratio)."""
    lines = ["random vs consecutive access (ex/s; ratio random/consecutive)"]
    for label, per in acc.items():
        for order, eps in per.items():
            parts = []
            for path in ("getitems", "getitem"):
                c, r = eps.get(f"{path}_consecutive"), eps.get(f"{path}_random")
                if c and r:
                    parts.append(f"{path}: {r:>9,.0f} / {c:>9,.0f} = {r / c:5.3f}")
            if "loader" in eps:
                parts.append(f"loader {eps['loader']:,.0f}")
            lines.append(f"  {label:8s} {order:9s} " + "   ".join(parts))
    for label in acc:
        if label in ("after", "megatron"):
            continue
        for order, eps in acc["after"].items():
            b = acc[label].get(order, {})
            if b.get("loader") and eps.get("loader"):
                lines.append(f"  loader after/{label}, {order}: "
                             f"{eps['loader'] / b['loader']:.3f}")
    return lines


__all__ = ["ACCESS_CODE", "ORDERS", "access_lines", "measure_access"]
