"""torchtitan 0.3.0 with its own code on 2 real ranks (torchrun, gloo, CPU; a job of the
session's shared launches, tests/integrations/_launches.py):

- titan's ``ParallelAwareDataloader`` (and a plain DataLoader) over a TokenDataset would
  give both ranks the same batches: refused, naming the fix (issue 29, item 1);
- ``shardwise.torchtitan.ShardwiseDataLoader``, built from its config with the arguments
  titan's trainer passes, gives each data-parallel rank its slice of every global batch,
  with next-token labels;
- titan's ``CheckpointManager`` (DCP) resumes it exactly on 2 ranks and on 1 (issue 29,
  item 2): the state is saved once under one key, not per dp rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tests.integrations._launches import FIRST, Job, Launches

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _titan_run import ACCUMULATION, AFTER, MICRO, SAVE, SEED, SEQ_LEN, titan_parts  # noqa: E402

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_titan_run.py")
WORLD = 2
GLOBAL = MICRO * WORLD * ACCUMULATION


def launch_jobs(root: Path) -> list[Job]:
    """About 5 global batches of 8 windows: the run crosses an epoch's reshuffle."""
    cache = make_cache(root / "cache",
                       [[d[:30] or [1] for d in sample_docs(30, seed=9, vocab_size=500)]],
                       chunk_docs=4, vocab_size=500, eod_id=0)
    return [Job("run", FIRST, RUN, {"cache": str(cache), "record": str(root / "run")})]


@pytest.fixture(scope="module")
def cache(launches: Launches) -> Path:
    return Path(launches.jobs["test_torchtitan"]["run"].spec["cache"])


@pytest.fixture(scope="module")
def record(launches: Launches) -> Path:
    return launches.record("test_torchtitan", "run")


def _order(cache: Path, start: int, stop: int) -> np.ndarray:
    """Positions ``[start, stop)`` of the global order, read in one process on purpose."""
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=SEED, world=sw.World.single())
    return ds.get_batch(list(range(start, stop)))["input_ids"]


def test_titans_own_loader_is_refused(record: Path) -> None:
    for loader in ("titan", "plain"):
        for r in range(WORLD):
            said = (record / f"refused.{loader}.r{r}.txt").read_text()
            assert said.startswith("ConfigError"), said  # in titan's worker process too
            assert "TokenDataset was asked for examples [0, 1]" in said, said
            assert "shardwise.torchtitan.ShardwiseDataLoader" in said, said
            assert "World.single()" in said and f"rank {r} of 2" in said, said


def test_each_rank_reads_its_slice(record: Path, cache: Path) -> None:
    runs = [np.load(record / f"run.r{r}.npz") for r in range(WORLD)]
    first = SAVE * ACCUMULATION  # micro-steps before the recorded ones
    for r, run in enumerate(runs):
        for k, rows in enumerate(run["input"]):
            at = (first + k) * MICRO * WORLD + r * MICRO
            assert np.array_equal(rows, _order(cache, at, at + MICRO)), (r, k)
        assert np.array_equal(run["labels"][:, :, :-1], run["input"][:, :, 1:])


def test_resume_on_two_ranks(record: Path) -> None:
    for r in range(WORLD):
        run, resumed = np.load(record / f"run.r{r}.npz"), np.load(record / f"resume.r{r}.npz")
        assert np.array_equal(run["input"], resumed["input"])
        assert np.array_equal(run["labels"], resumed["labels"])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP, 1 process
@pytest.mark.filterwarnings("ignore:To get the last learning rate:UserWarning")  # titan's LR
def test_resume_on_one_rank(record: Path, cache: Path) -> None:
    """The 2-rank checkpoint, loaded by titan's checkpointer in this one process (dp 1,
    accumulation 4: the same global batches): the same continuation of the order."""
    dl, ckpt = titan_parts({"cache": str(cache), "record": str(record)}, 1, 0)
    try:
        assert ckpt.load(step=SAVE)
        it = iter(dl)
        got = np.concatenate([next(it)[0]["input"].numpy()
                              for _ in range(AFTER * ACCUMULATION * WORLD)])
    finally:
        ckpt.close()
    assert np.array_equal(got, _order(cache, SAVE * GLOBAL, (SAVE + AFTER) * GLOBAL))
