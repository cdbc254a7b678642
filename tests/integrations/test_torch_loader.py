"""The torch loader in one process: global order across simulated ranks, exact resume,
refusal of foreign states, evaluation padding, the cyclic sampler."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import shardwise as sw
from shardwise.errors import ConfigError, StateError
from shardwise.testing import assert_resumes_exactly, assert_same_global_order, global_rows
from shardwise.torch import loader


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
              tokenizer_path: Path) -> Path:
    out = tmp_path_factory.mktemp("tl") / "cache"
    sw.build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=16, append_eod=True,
             workers=2, progress=False)
    return out


@pytest.fixture(scope="module")
def ds(cache_dir: Path) -> sw.TokenDataset:
    return sw.TokenDataset(cache_dir, seq_len=32, seed=1234)


def test_batches_are_tensors_of_the_planned_windows(ds: sw.TokenDataset) -> None:
    dl = loader(ds, global_batch_size=8, micro_batch_size=4, world=sw.World(0, 1))
    batch = next(iter(dl))
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (4, 32)
    assert (batch["input_ids"].numpy() == ds.__getitems__([0, 1, 2, 3])["input_ids"]).all()


def test_same_global_order_for_every_world_size(ds: sw.TokenDataset) -> None:
    assert_same_global_order(
        lambda w: loader(ds, global_batch_size=16, micro_batch_size=2, world=w),
        world_sizes=[1, 2, 4, 8], steps=32)
    rows = global_rows(lambda w: loader(ds, global_batch_size=16, micro_batch_size=2,
                                        world=w), 4, 8)
    assert (rows == ds.__getitems__(list(range(64)))["input_ids"]).all()


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_every_step(ds: sw.TokenDataset, workers: int) -> None:
    def make() -> sw.torch.ShardwiseLoader:
        return loader(ds, global_batch_size=8, micro_batch_size=2, world=sw.World(1, 2),
                      num_workers=workers)

    points = None if workers == 0 else [0, 3, 7]
    assert_resumes_exactly(make, steps=12, stop_points=points)


def test_spawned_workers_read_the_same_batches(ds: sw.TokenDataset, tmp_path: Path) -> None:
    """Workers started with spawn (macOS's default; forkserver on newer Pythons) get the
    dataset pickled after it has read: they map their own chunks and agree."""
    doc = sw.TokenDataset(ds.cache, seq_len=32, seed=7, shuffle="document",
                          plan_dir=tmp_path)
    want = [doc.__getitems__([4 * k + 2, 4 * k + 3])["input_ids"] for k in range(6)]
    dl = loader(doc, global_batch_size=4, micro_batch_size=2, world=sw.World(1, 2),
                num_workers=2, multiprocessing_context="spawn")
    it = iter(dl)
    got = [next(it)["input_ids"].numpy() for _ in range(6)]
    del it
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_resume_under_another_world_size(ds: sw.TokenDataset) -> None:
    first = [loader(ds, global_batch_size=8, micro_batch_size=2, world=sw.World(r, 2))
             for r in range(2)]
    its = [iter(d) for d in first]
    for _ in range(5):  # 5 steps of 2 ranks × 2 = 20 examples, not a global-batch boundary
        for it in its:
            next(it)
    states = [d.state_dict() for d in first]
    assert states[0] == states[1] and states[0]["consumed"] == 20
    saved = json.loads(json.dumps(states[0]))
    resumed = []
    for r in range(4):
        d = loader(ds, global_batch_size=8, micro_batch_size=1, world=sw.World(r, 4))
        d.load_state_dict(saved)
        resumed.append(d)
    tail = np.concatenate([next(iter(d))["input_ids"].numpy() for d in resumed])
    assert (tail == ds.__getitems__(list(range(20, 24)))["input_ids"]).all()
    bad = loader(ds, global_batch_size=24, micro_batch_size=3, world=sw.World(0, 8))
    with pytest.raises(StateError, match="not a multiple of micro_batch_size × world size = 24"):
        bad.load_state_dict(saved)


def test_foreign_state_is_refused_naming_the_difference(ds: sw.TokenDataset,
                                                       cache_dir: Path) -> None:
    dl = loader(ds, global_batch_size=8, micro_batch_size=2, world=sw.World(0, 1))
    state = dl.state_dict()
    other = sw.TokenDataset(cache_dir, seq_len=32, seed=99)
    with pytest.raises(StateError, match="seed: state has 1234, this reader has 99"):
        loader(other, global_batch_size=8, micro_batch_size=2).load_state_dict(state)
    longer = sw.TokenDataset(cache_dir, seq_len=64, seed=1234)
    with pytest.raises(StateError, match="seq_len: state has 32"):
        loader(longer, global_batch_size=8, micro_batch_size=2).load_state_dict(state)
    with pytest.raises(StateError, match="missing"):
        dl.load_state_dict({"consumed": 3})
    with pytest.raises(StateError, match="version"):
        dl.load_state_dict({**state, "version": 99})


def test_eval_pass_sees_every_example_once_with_masked_padding(cache_dir: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=32, shuffle="none", drop_last=False)
    n = len(ds)
    m, w = 3, 2
    assert n % (m * w)  # padding is needed
    seen, steps = [], []
    for r in range(w):
        dl = loader(ds, global_batch_size=m * w, micro_batch_size=m, world=sw.World(r, w),
                    sampler="eval")
        batches = list(dl)
        steps.append(len(batches))
        for b in batches:
            real = b["loss_mask"].sum(dim=1) > 0
            seen.extend(b["input_ids"][real].numpy().tolist())
            assert (b["loss_mask"][~real] == 0).all()
    assert steps[0] == steps[1] == -(-n // (m * w))
    expected = ds.__getitems__(list(range(n)))["input_ids"].tolist()
    assert sorted(seen) == sorted(expected) and len(seen) == n


def test_epochs_bound_the_run_and_cyclic_reshuffles(cache_dir: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=32, shuffle="none")
    n = len(ds)
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1), epochs=1)
    assert len(dl) == n // 4 and sum(1 for _ in dl) == n // 4
    cyc = loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 2),
                 sampler="cyclic", seed=5, total_samples=2 * (n - n % 4))
    firsts = [b["input_ids"][0].numpy() for b in cyc]
    assert len(firsts) == 2 * (n // 4)


def test_layout_errors(ds: sw.TokenDataset) -> None:
    with pytest.raises(ConfigError, match="must be a multiple of micro_batch_size × world"):
        loader(ds, global_batch_size=10, micro_batch_size=4, world=sw.World(0, 2))
    with pytest.raises(ConfigError, match="sampler must be one of"):
        loader(ds, global_batch_size=8, micro_batch_size=4, sampler="random")


def test_an_iterable_reader_is_refused_naming_its_loader(cache_dir: Path) -> None:
    """loader() places map-style datasets; an iterable reader places itself (issue 20)."""
    packed = sw.PackedSFT([{"input_ids": [1, 2, 3]}] * 4, seq_len=8)
    stream = sw.StreamDataset(cache_dir, seq_len=16, streams=2)
    for reader in (packed, stream):
        with pytest.raises(ConfigError, match=r"is iterable and places itself.*DataLoader"):
            loader(reader, global_batch_size=4, micro_batch_size=2)
