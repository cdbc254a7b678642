"""set_epoch on map-style readers (issue 20 item 4): through a plain DataLoader, accelerate
and torchdata's StatefulDataLoader, epoch e reads positions [e·n, (e+1)·n) of the global
order — epoch 1 is reshuffled, not epoch 0 again — and a resume that sets the epoch again
continues exactly; shardwise's own loaders, which walk the epochs themselves, refuse a
reader moved to another epoch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardwise as sw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

SEQ_LEN = 16


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cache(tmp_path_factory.mktemp("epochs") / "cache",
                      [sample_docs(12, seed=5, vocab_size=500)], chunk_docs=3, eod_id=0)


def _readers(cache: Path) -> dict[str, object]:
    a = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    b = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=8)
    return {"TokenDataset": a, "Blend": sw.Blend([a, b], [0.5, 0.5], seed=3, length=len(a))}


def _epoch(ds: object, e: int) -> np.ndarray:
    """Epoch ``e`` of ``ds``'s global order, read by position (``ds`` at epoch 0)."""
    assert ds.epoch == 0  # type: ignore[attr-defined]
    n = len(ds)  # type: ignore[arg-type]
    return np.asarray(ds.get_batch(list(range(e * n, (e + 1) * n)))["input_ids"])  # type: ignore[attr-defined]


def _rows(dl: object) -> np.ndarray:
    return np.concatenate([b["input_ids"].numpy() for b in dl])  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["TokenDataset", "Blend"])
@pytest.mark.parametrize("workers", [0, 2])
def test_plain_dataloader_reshuffles_with_set_epoch(cache: Path, name: str,
                                                    workers: int) -> None:
    ds = _readers(cache)[name]
    want = [_epoch(ds, e) for e in range(3)]
    assert not np.array_equal(want[0], want[1])  # the global order reshuffles per epoch
    dl = DataLoader(ds, batch_size=4, num_workers=workers)  # type: ignore[arg-type]
    for e in range(3):
        ds.set_epoch(e)  # type: ignore[attr-defined]
        assert np.array_equal(_rows(dl), want[e]), f"epoch {e}"
    ds.set_epoch(0)  # type: ignore[attr-defined]
    assert np.array_equal(_rows(dl), want[0])


def test_set_epoch_keeps_the_fingerprint_and_checks_its_argument(cache: Path) -> None:
    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    before = ds.state_config()
    ds.set_epoch(5)
    assert ds.state_config() == before and ds.epoch == 5
    for bad in (-1, 1.5, True):
        with pytest.raises(sw.ConfigError, match="epoch"):
            ds.set_epoch(bad)  # type: ignore[arg-type]
    pad = ds.get_batch([sw.PAD])
    assert (pad["loss_mask"] == 0).all()  # PAD is not shifted


def test_accelerate_calls_set_epoch(cache: Path) -> None:
    """accelerate's prepared loader forwards set_epoch to the dataset (its sampler has
    none): epoch 1 is epoch 1's order."""
    from accelerate import Accelerator

    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    want = [_epoch(ds, e) for e in range(2)]
    dl = Accelerator(cpu=True).prepare(DataLoader(ds, batch_size=4))
    for e in range(2):
        dl.set_epoch(e)
        assert ds.epoch == e
        assert np.array_equal(_rows(dl), want[e]), f"epoch {e}"


def test_stateful_dataloader_resumes_inside_a_later_epoch(cache: Path) -> None:
    """torchdata saves the sampler's place; the trainer saves the epoch and sets it again:
    the rest of epoch 1 follows exactly."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    want = _epoch(ds, 1)
    ds.set_epoch(1)
    dl = StatefulDataLoader(ds, batch_size=4)
    it = iter(dl)
    head = [next(it)["input_ids"].numpy() for _ in range(2)]
    state = dl.state_dict()
    again = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    again.set_epoch(1)
    resumed = StatefulDataLoader(again, batch_size=4)
    resumed.load_state_dict(state)
    tail = _rows(resumed)
    assert np.array_equal(np.concatenate([*head, tail]), want)


def test_shardwise_loaders_refuse_a_moved_epoch(cache: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardwise.torch import loader
    from shardwise.torchdata import batch_sampler

    ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=7)
    ds.set_epoch(1)
    one = sw.World.single()
    with pytest.raises(sw.ConfigError, match=r"set_epoch\(1\).*set_epoch\(0\)"):
        next(iter(loader(ds, global_batch_size=4, micro_batch_size=4, world=one)))
    bs = batch_sampler(ds, global_batch_size=4, micro_batch_size=4, world=one)
    with pytest.raises(sw.ConfigError, match=r"set_epoch\(1\)"):
        next(iter(StatefulDataLoader(ds, batch_sampler=bs)))
    ds.set_epoch(0)  # back on the global order: the loader walks the epochs itself
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=one)
    n = len(ds) // 4 * 4
    rows = np.concatenate([b["input_ids"].numpy() for _, b in zip(range(n // 4 + 2), dl,
                                                                      strict=False)])
    assert np.array_equal(rows, ds.get_batch(list(range(n + 8)))["input_ids"])
    assert torch.is_tensor(next(iter(dl))["input_ids"])
