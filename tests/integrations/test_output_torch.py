"""Compact batches through the torch integrations: expanded on the device they are the
default batches (keys, dtypes, values), with and without DataLoader workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.torch import expand, loader

COMPACT = sw.Output(dtype="stored", compact=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("output_torch") / "cache"
    return make_cache(root, [[[65_000 + t % 500 for t in d] for d in sample_docs(80, seed=4)]],
                      chunk_docs=5, vocab_size=65_536)


def batches(dl: object, n: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for b in dl:  # type: ignore[attr-defined]
        out.append(b)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_compact_expands_to_the_default_batches(cache_dir: Path, workers: int) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=32, seed=1, reset_position_ids=True)
    kw = dict(global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
              num_workers=workers)
    full = batches(loader(ds, **kw), 5)  # type: ignore[arg-type]
    small_dl = loader(ds, output=COMPACT, **kw)  # type: ignore[arg-type]
    assert ds.output == sw.Output() and small_dl.dataset.output == COMPACT  # a copy
    small = batches(small_dl, 5)
    for a, b in zip(full, small, strict=True):
        assert b["tokens"].dtype == torch.uint16  # ids over 32,767 survive the trip
        e = expand(b)
        assert list(e) == list(a)
        for k in a:
            assert e[k].dtype == a[k].dtype and torch.equal(e[k], a[k]), k
    assert small_dl.state_dict()["fingerprint"] == loader(ds, **kw).state_dict()["fingerprint"]  # type: ignore[arg-type]


def test_int32_batches_for_jax(cache_dir: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=32, seed=1)
    b = next(iter(loader(ds, global_batch_size=2, micro_batch_size=2, world=sw.World(0, 1),
                         output=sw.Output(dtype="int32"))))
    assert {k: v.dtype for k, v in b.items()} == {
        "input_ids": torch.int32, "labels": torch.int32, "loss_mask": torch.float32,
        "position_ids": torch.int32}
