"""Lightning under torchrun (DDP, gloo, CPU, 2 processes, gradient accumulation 2; a tiny
linear LM): every optimizer step's global batch is shardwise's, each Lightning epoch is a
reshuffled epoch of the order, and resuming from ``step=k.ckpt`` (mid-epoch, on 2 and on 1
process) continues with exactly the uninterrupted run's batches — although Lightning's
fetcher pulls one micro-batch ahead of the one it trains. Both loaders: ``shardwise.torch
.loader`` and torchdata's ``StatefulDataLoader``, through ``shardwise.lightning.loader``,
with Lightning's default ``use_distributed_sampler=True``. Each run is a job of the
session's shared launches (tests/integrations/_launches.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tests.integrations._launches import FIRST, ONE, RESUME, Job, Launches

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_lightning_run.py")
SEQ_LEN, MICRO, GLOBAL, VOCAB = 9, 2, 8, 500
KINDS = ["shardwise-single", "torchdata-single", "shardwise-cyclic", "torchdata-cyclic"]
pytest.importorskip("lightning")


def _steps(record: Path, kind: str, world: int) -> list[np.ndarray]:
    """Per-rank micro-batches → each optimizer step's rows in shardwise's order (micro-step
    k of a step holds examples [k·m·W + r·m, …) on rank r)."""
    seen = [np.load(record / f"{kind}.seen.r{r}.npy") for r in range(world)]
    acc = GLOBAL // (MICRO * world)
    return [np.concatenate([seen[r][s * acc + k] for k in range(acc) for r in range(world)])
            for s in range(len(seen[0]) // acc)]


def launch_jobs(root: Path) -> list[Job]:
    """The full run on 2 processes, resumed from ``step=k.ckpt`` on 2 and on 1."""
    cache = make_cache(root / "cache", [sample_docs(10, seed=2, vocab_size=VOCAB)],
                       chunk_docs=3, eod_id=0)
    per_epoch = len(sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)) // GLOBAL
    base = {"cache": str(cache), "seq_len": SEQ_LEN, "vocab": VOCAB, "micro": MICRO,
            "global": GLOBAL, "epochs": 2, "steps": 2 * per_epoch, "kinds": KINDS}
    full = str(root / "full")
    k = per_epoch + 1  # a checkpoint inside the second epoch
    return [Job("full", FIRST, RUN, {**base, "record": full}),
            Job("on2", RESUME, RUN, {**base, "resume": full, "step": k,
                                      "record": str(root / "on2")}),
            Job("on1", ONE, RUN, {**base, "resume": full, "step": k,
                                   "record": str(root / "on1")})]


def test_lightning_resume_is_the_uninterrupted_run(launches: Launches) -> None:
    jobs = launches.jobs["test_lightning"]
    ds = sw.TokenDataset(jobs["full"].spec["cache"], seq_len=SEQ_LEN, seed=7)
    per_epoch = len(ds) // GLOBAL
    assert per_epoch >= 3, len(ds)
    k = per_epoch + 1  # a checkpoint inside the second epoch
    assert jobs["on2"].spec["step"] == jobs["on1"].spec["step"] == k
    full, on2, on1 = (launches.record("test_lightning", n) for n in ("full", "on2", "on1"))
    order = [ds[i]["input_ids"] for i in range(len(ds))]
    for kind in KINDS:
        steps = _steps(full, kind, 2)
        assert len(steps) == 2 * per_epoch
        if kind.endswith("cyclic"):  # each Lightning epoch: one reshuffled epoch of the order
            _check_epochs(steps, per_epoch, order)
        for record, world in ((on2, 2), (on1, 1)):
            cont = _steps(record, kind, world)
            assert len(cont) == len(steps) - k, (kind, world, len(cont))
            for got, want in zip(cont, steps[k:], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"{kind} resumed on {world}")
        np.testing.assert_array_equal(np.load(on2 / f"{kind}.params.npy"),
                                      np.load(full / f"{kind}.params.npy"))


def _check_epochs(steps: list[np.ndarray], per_epoch: int, order: list[np.ndarray]) -> None:
    epochs = [np.concatenate(steps[e * per_epoch:(e + 1) * per_epoch]) for e in (0, 1)]
    rows = [sorted(map(bytes, e)) for e in epochs]
    assert rows[0] == rows[1] and not np.array_equal(epochs[0], epochs[1])
    assert len(set(rows[0])) == len(rows[0]) and set(rows[0]) <= set(map(bytes, order))
