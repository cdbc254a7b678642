"""Lightning Fabric and litgpt 0.5.13 over shardwise (issue 29, item 3), on CPU:

- ``fabric.setup_dataloaders(shardwise.torch.loader(...))`` under Fabric DDP on 2 processes
  (it raised "can't inject a (distributed) sampler into your batch sampler"): each rank
  reads its slice of every global batch; ``fabric.save``/``fabric.load`` resume exactly;
- ``shardwise.litgpt.ShardwiseData`` through litgpt's own ``pretrain``: ``setup`` on one
  device, and ``main`` under that Fabric DDP: the model trains on the global order's
  windows, each rank its slice, and a run resumed from litgpt's step-1 checkpoint trains on
  exactly what the uninterrupted run did after it.

One torchrun launch (2 processes) and, beside it, one single-device process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _litgpt_run import GLOBAL, MICRO, READ, SEED, SEQ_LEN, STEPS  # noqa: E402
from test_hf_trainer import REPO, TIMEOUT, torchrun  # noqa: E402

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_litgpt_run.py")
WORLD = 2
ENV = {"TORCHDYNAMO_DISABLE": "1"}  # litgpt compiles its model: eager on CPU, same math


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("litgpt") / "cache"
    return make_cache(root, [[d[:30] or [1] for d in sample_docs(40, seed=9, vocab_size=500)]],
                      chunk_docs=4, vocab_size=500, eod_id=0)


@pytest.fixture(scope="module")
def records(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The single-device run (a process of its own) beside the 2-process DDP launch."""
    single = tmp_path_factory.mktemp("litgpt-single")
    (single / "spec.json").write_text(json.dumps({"mode": "single", "cache": str(cache),
                                                   "record": str(single)}))
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    one = subprocess.Popen([sys.executable, str(RUN), str(single / "spec.json")], env=env,
                           cwd=single, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.environ.update(ENV)
    try:
        ddp = torchrun(tmp_path_factory.mktemp("litgpt-ddp"), "run", WORLD,
                       {"mode": "ddp", "cache": str(cache)}, script=RUN)
    finally:
        for k in ENV:
            os.environ.pop(k)
        out, _ = one.communicate(timeout=TIMEOUT)
    assert one.returncode == 0, out.decode()[-6000:]
    return {"single": single, "ddp": ddp}


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
