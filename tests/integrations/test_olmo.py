"""OLMo-core 3.0.0 over shardwise (issue 29, item 4b): ``shardwise.olmo.ShardwiseDataLoader``
is an OLMo ``TextDataLoaderBase``; driven as OLMo's Trainer drives it (reshuffle, iterate,
state_dict saved per rank, load_state_dict into a new loader, reshuffle) on 2 real ranks
(torchrun, gloo; a job of the session's shared launches), each rank reads its slice of
every global batch, and a resumed run continues exactly, across an OLMo epoch boundary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.integrations._launches import FIRST, Job, Launches

import shardwise as sw
from shardwise.errors import ConfigError, StateError
from shardwise.olmo import ShardwiseDataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cachefactory import make_cache, sample_docs  # noqa: E402

RUN = Path(__file__).resolve().with_name("_olmo_loader_run.py")
SEQ, MICRO, WORLD, GLOBAL, STEPS, SEED = 16, 2, 2, 8, 8, 3  # accumulation 2


def launch_jobs(root: Path) -> list[Job]:
    """3 global batches per OLMo epoch: 8 steps cross two epoch boundaries, and the
    resumed half starts mid-epoch (step 4 of 8)."""
    docs = [d or [1] for d in sample_docs(14, seed=5, vocab_size=256)]
    cache = make_cache(root / "cache", [docs], chunk_docs=4, vocab_size=256, eod_id=0)
    spec = {"cache": str(cache), "seq_len": SEQ, "micro": MICRO, "global": GLOBAL,
            "steps": STEPS, "seed": SEED, "record": str(root / "runs")}
    return [Job("runs", FIRST, RUN, spec)]


@pytest.fixture(scope="module")
def cache(launches: Launches) -> Path:
    return Path(launches.jobs["test_olmo"]["runs"].spec["cache"])


@pytest.fixture(scope="module")
def runs(launches: Launches) -> Path:
    return launches.record("test_olmo", "runs")


def test_each_rank_reads_its_slice_of_the_global_order(cache: Path, runs: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=SEQ, seed=SEED)
    assert len(ds) // GLOBAL == 3  # the run crosses OLMo epochs
    index = [np.load(runs / f"full.index.r{r}.npy") for r in range(WORLD)]
    rows = [np.load(runs / f"full.rows.r{r}.npy") for r in range(WORLD)]
    for s in range(STEPS):
        # micro-step a of rank r: positions s·B + a·m·W + r·m + [0, m), as trace names them
        for r in range(WORLD):
            want = [s * GLOBAL + a * MICRO * WORLD + r * MICRO + j
                    for a in range(GLOBAL // (MICRO * WORLD)) for j in range(MICRO)]
            assert index[r][s].tolist() == want, f"step {s}, rank {r}"
            assert np.array_equal(rows[r][s], ds.get_batch(want)["input_ids"])
        both = np.concatenate([index[r][s] for r in range(WORLD)])
        assert sorted(both.tolist()) == list(range(s * GLOBAL, (s + 1) * GLOBAL))


def test_a_resumed_run_continues_exactly(runs: Path) -> None:
    for r in range(WORLD):
        for what in ("index", "rows"):
            full = np.load(runs / f"full.{what}.r{r}.npy")
            resumed = np.load(runs / f"resumed.{what}.r{r}.npy")
            assert np.array_equal(full, resumed), f"rank {r}: {what} differ after resume"
    states = [json.loads((runs / f"state.r{r}.json").read_text()) for r in range(WORLD)]
    assert states[0]["shardwise"] == states[1]["shardwise"]  # a global position
    assert states[0]["shardwise"]["consumed"] == (STEPS // 2) * GLOBAL


def _loader(cache: Path, tmp_path: Path, **kw: object) -> ShardwiseDataLoader:
    ds = sw.TokenDataset(cache, seq_len=SEQ, seed=kw.pop("seed", SEED))  # type: ignore[arg-type]
    return ShardwiseDataLoader(ds, work_dir=tmp_path, world=sw.World(0, 1),
                               **{"global_batch_size": GLOBAL * SEQ, **kw})  # type: ignore[arg-type]


def test_refusals_name_the_fix(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="global_batch_size is in tokens"):
        _loader(cache, tmp_path, global_batch_size=GLOBAL * SEQ + 1)
    dl = _loader(cache, tmp_path)
    dl.reshuffle(1)
    next(iter(dl))
    other = _loader(cache, tmp_path, seed=SEED + 1)
    with pytest.raises(StateError, match="seed"):
        other.load_state_dict(dl.state_dict())
    with pytest.raises(StateError, match="no 'shardwise' key"):
        other.load_state_dict({"batches_processed": 1, "epoch": 1})
    mock = dl.get_mock_batch()
    assert tuple(mock["input_ids"].shape) == (GLOBAL, SEQ)
