"""Every map-style shardwise dataset under the standard protocols, unchanged: torch's
``DataLoader(ds, batch_size=B)`` (default_collate), HF's ``default_data_collator``, and
torchdata's ``StatefulDataLoader`` over shardwise's batch sampler, resuming exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import default_data_collator

import shardwise as sw
from shardwise.testing import assert_resumes_exactly
from shardwise.torch import collate, loader
from shardwise.torchdata import batch_sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("protocols") / "cache"
    return make_cache(root, [sample_docs(60, seed=1), sample_docs(40, seed=2)], chunk_docs=7,
                      eod_id=0)


def _datasets(cache: Path) -> dict[str, object]:
    tok = sw.TokenDataset(cache, seq_len=16, seed=3)
    packed = sw.TokenDataset(cache, seq_len=16, seed=4, reset_position_ids=True)
    shards = sw.ContiguousShards([list(range(10)), list(range(10, 17))], lambda s: [
        {"input_ids": np.full(4, x)} for x in s], world=sw.World.single())
    return {"tokens": tok, "blend": sw.Blend([tok, packed], [0.5, 0.5], seed=1),
            "packed": packed, "contiguous": shards}


@pytest.mark.parametrize("name", ["tokens", "blend", "packed", "contiguous"])
@pytest.mark.parametrize("collator", ["torch", "hf"])
def test_plain_dataloader_and_default_collators(cache: Path, name: str, collator: str) -> None:
    ds = _datasets(cache)[name]
    fn = default_data_collator if collator == "hf" else None
    kwargs = {} if fn is None else {"collate_fn": fn}
    batch = next(iter(DataLoader(ds, batch_size=4, **kwargs)))  # type: ignore[arg-type]
    want = [ds[i] for i in range(4)]  # type: ignore[index]
    for key in ("input_ids", "labels", "loss_mask", "position_ids"):
        if key in want[0]:
            got = batch[key].numpy()
            assert np.array_equal(got, np.stack([np.asarray(w[key]) for w in want])), key


def test_rows_are_views_and_keep_the_stacked_arrays(cache: Path) -> None:
    """cu_seqlens rows differ in length (stock collators cannot stack them: shardwise's
    collate keeps the flat array); each row gets its own boundaries."""
    ds = sw.TokenDataset(cache, seq_len=16, seed=4, reset_position_ids=True, cu_seqlens=True)
    rows = ds.__getitems__([0, 5, 9])  # type: ignore[attr-defined]
    assert len(rows) == 3 and isinstance(rows[0], dict)
    assert np.shares_memory(rows[1]["input_ids"], rows.batch["input_ids"])
    assert rows["input_ids"] is rows.batch["input_ids"]  # the batched dict's reading
    flat = rows.batch["cu_seqlens"]
    L = 16
    for r in range(3):
        inner = flat[(flat > r * L) & (flat < (r + 1) * L)] - r * L
        assert rows[r]["cu_seqlens"].tolist() == [0, *inner.tolist(), L]
    assert set(collate(rows)) == set(rows.batch)


def test_loader_accepts_a_collate_fn(cache: Path) -> None:
    ds = _datasets(cache)["tokens"]
    seen = []

    def fn(rows: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        seen.append(type(rows).__name__)
        return default_data_collator(rows)  # type: ignore[no-any-return]

    dl = loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(1, 2),
                collate_fn=fn)
    ref = loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(1, 2))
    for got, want in zip(dl, ref, strict=False):
        assert torch.equal(got["input_ids"], want["input_ids"])
        if len(seen) == 3:
            break
    assert seen == ["Rows"] * 3


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(cache: Path, workers: int) -> None:
    ds = _datasets(cache)["tokens"]

    def make() -> StatefulDataLoader:
        bs = batch_sampler(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(1, 2))
        return StatefulDataLoader(ds, batch_sampler=bs, num_workers=workers,
                                  collate_fn=collate)

    assert_resumes_exactly(make, steps=8, stop_points=[0, 3, 5] if workers else None)
    # the position is shardwise's global order (the same as shardwise's own loader)
    ref = loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(1, 2))
    for got, want in zip(make(), ref, strict=False):
        assert torch.equal(got["input_ids"], want["input_ids"])
        break


def test_stateful_dataloader_state_is_shardwise_and_refuses_other_data(cache: Path) -> None:
    ds = _datasets(cache)["tokens"]
    bs = batch_sampler(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 2))
    dl = StatefulDataLoader(ds, batch_sampler=bs, collate_fn=collate)
    it = iter(dl)
    next(it), next(it)
    state = dl.state_dict()
    assert state["_sampler_iter_state"]["consumed"] == 8
    other = sw.TokenDataset(cache, seq_len=16, seed=99)
    dl2 = StatefulDataLoader(other, batch_sampler=batch_sampler(
        other, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 2)),
        collate_fn=collate)
    dl2.load_state_dict(state)  # torchdata applies a state on the next iter()
    with pytest.raises(sw.StateError, match="seed"):
        next(iter(dl2))


def test_packed_sft_through_a_plain_dataloader() -> None:
    """PackedSFT is an IterableDataset for torch; its rows carry their own cu_seqlens
    (different lengths), which shardwise's collate flattens over the batch."""
    recs = [{"input_ids": list(range(1, 3 + j % 9))} for j in range(60)]
    rows = list(sw.PackedSFT(recs, seq_len=24, group_size=16, seed=1))[:4]
    batch = next(iter(DataLoader(sw.PackedSFT(recs, seq_len=24, group_size=16, seed=1),
                                 batch_size=4, collate_fn=collate)))
    assert np.array_equal(batch["input_ids"].numpy(), np.stack([r["input_ids"] for r in rows]))
    want = [0] + [int(c) + 24 * i for i, r in enumerate(rows) for c in r["cu_seqlens"][1:]]
    assert batch["cu_seqlens"].tolist() == want
