"""Lightning Fabric and litgpt 0.5.13 over shardwise (issue 29, item 3), on CPU:

- ``fabric.setup_dataloaders(shardwise.torch.loader(...))`` under Fabric DDP on 2 processes
  (it raised "can't inject a (distributed) sampler into your batch sampler"): each rank
  reads its slice of every global batch; ``fabric.save``/``fabric.load`` resume exactly;
- ``shardwise.litgpt.ShardwiseData`` through litgpt's own ``pretrain``: ``setup`` on one
  device, and ``main`` under that Fabric DDP: the model trains on the global order's
  windows, each rank its slice, and a run resumed from litgpt's step-1 checkpoint trains on
  exactly what the uninterrupted run did after it.

Two jobs of the session's shared launches (tests/integrations/_launches.py): the 2-process
DDP run, and the single-device run in the one-process launch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tests.integrations._launches import FIRST, ONE, Job, Launches

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _litgpt_run import GLOBAL, MICRO, READ, SEED, SEQ_LEN, STEPS  # noqa: E402

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_litgpt_run.py")
WORLD = 2
ENV = {"TORCHDYNAMO_DISABLE": "1"}  # litgpt compiles its model: eager on CPU, same math


def launch_jobs(root: Path) -> list[Job]:
    """The 2-process DDP run and the single-device run (a process without torchrun's rank
    variables: the job hides them)."""
    cache = str(make_cache(root / "cache",
                           [[d[:30] or [1] for d in sample_docs(40, seed=9, vocab_size=500)]],
                           chunk_docs=4, vocab_size=500, eod_id=0))
    return [Job("ddp", FIRST, RUN, {"mode": "ddp", "cache": cache, "record": str(root / "ddp")},
                env=ENV),
            Job("single", ONE, RUN, {"mode": "single", "cache": cache,
                                     "record": str(root / "single")}, env=ENV)]


@pytest.fixture(scope="module")
def cache(launches: Launches) -> Path:
    return Path(launches.jobs["test_litgpt"]["ddp"].spec["cache"])


@pytest.fixture(scope="module")
def records(launches: Launches) -> dict[str, Path]:
    return {name: launches.record("test_litgpt", name) for name in ("single", "ddp")}


def _order(cache: Path, n: int) -> np.ndarray:
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=SEED, world=sw.World.single())
    return ds.get_batch(list(range(n)))["input_ids"]


def _slice(order: np.ndarray, k: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s ``k``-th micro-batch: examples ``[k·m·W + r·m, …)``."""
    at = k * MICRO * WORLD + rank * MICRO
    return order[at:at + MICRO]


def test_fabric_setup_dataloaders_places_and_resumes(records: dict[str, Path],
                                                     cache: Path) -> None:
    order = _order(cache, 4 * READ * MICRO * WORLD)
    for r in range(WORLD):
        got = np.load(records["ddp"] / f"fabric.r{r}.npz")
        seen = np.concatenate([got["first"], got["run"]])
        for k, rows in enumerate(seen):
            assert np.array_equal(rows, _slice(order, k, r)), (r, k)
        assert np.array_equal(got["resumed"], got["run"])


def test_litgpt_pretrain_on_two_processes(records: dict[str, Path], cache: Path) -> None:
    order, accumulation = _order(cache, STEPS * GLOBAL), GLOBAL // (MICRO * WORLD)
    for r in range(WORLD):
        run = np.load(records["ddp"] / f"litgpt.run.r{r}.npy")
        assert len(run) == STEPS * accumulation
        for k, rows in enumerate(run):
            assert np.array_equal(rows, _slice(order, k, r)), (r, k)
        resumed = np.load(records["ddp"] / f"litgpt.resumed.r{r}.npy")
        assert np.array_equal(resumed, run[accumulation:])  # from the step-1 checkpoint


def test_litgpt_pretrain_on_one_device(records: dict[str, Path], cache: Path) -> None:
    order = _order(cache, STEPS * GLOBAL)
    run = np.load(records["single"] / "litgpt.run.r0.npy")
    assert np.array_equal(run.reshape(-1, SEQ_LEN), order)
    resumed = np.load(records["single"] / "litgpt.resumed.r0.npy")
    assert np.array_equal(resumed.reshape(-1, SEQ_LEN), order[GLOBAL:])
