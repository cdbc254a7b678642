"""llm.datasets' DistributedShardedDataset and ResumableSequentialSampler, called as their
docs and tests call them; plus the TODOs (prefetch, per-epoch shard order, in-shard
shuffle), the reported tail drop, sampler state, and the DistributedSampler refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from shardwise.compat.llm import (
    DatasetParams,
    DistributedShardedDataset,
    ResumableSequentialSampler,
)
from shardwise.errors import ConfigError, StateError


class SimpleDataset(torch.utils.data.Dataset[int]):
    """The original test suite's shard: sample ``i`` is ``shard_offset + i``."""

    opened = 0

    def __init__(self, samples: int, shard_offset: int) -> None:
        self.samples, self.shard_offset = samples, shard_offset
        SimpleDataset.opened += 1

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.samples:
            raise IndexError(index)
        return self.shard_offset + index


def simple_dataset_params(shard_samples: list[int]) -> dict[str, DatasetParams]:
    params: dict[str, DatasetParams] = {}
    offset = 0
    for i, samples in enumerate(shard_samples):
        params[f"shard-{i}"] = ((), {"samples": samples, "shard_offset": offset})
        offset += samples
    return params


def make(shards: list[int], rank: int = 0, world_size: int = 1, **kw: Any
         ) -> DistributedShardedDataset:
    return DistributedShardedDataset(SimpleDataset, simple_dataset_params(shards),
                                     rank=rank, world_size=world_size, **kw)


def test_the_original_contract() -> None:
    with pytest.raises(ValueError):
        DistributedShardedDataset(SimpleDataset, {}, rank=1, world_size=1)
    with pytest.raises(ValueError):
        DistributedShardedDataset(SimpleDataset, {}, rank=0, world_size=1)
    for ranks, shards, per_rank in ((1, [100, 200], 300), (4, [100, 101], 50),
                                    (4, [100, 200, 300, 400], 250)):
        assert all(len(make(shards, r, ranks)) == per_rank for r in range(ranks))
    with pytest.raises(IndexError):
        make([10])[10]
    shards = [13, 17, 19, 23, 29]
    seen = [x for r in range(3) for ds in [make(shards, r, 3)] for x in
            (ds[i] for i in range(len(ds)))]
    total = sum(shards)
    assert sorted(seen) == list(range(total - total % 3))  # contiguous, tail dropped


def test_index_maps_and_the_reported_tail_drop() -> None:
    ds = make([4, 3, 5], rank=1, world_size=5)  # 12 samples, 2 per rank, 2 dropped
    assert (len(ds), ds.dropped, ds.total_samples) == (2, 2, 10)
    assert "dropped 2 examples" in repr(ds) and ds.drops()[0].count == 2
    assert repr(ds).startswith("DistributedShardedDataset(")
    assert [ds.rank_index_to_global_index(i) for i in range(2)] == [2, 3]
    assert [ds.rank_index_to_shard_index(i) for i in range(2)] == [("shard-0", 2),
                                                                   ("shard-0", 3)]
    assert ds.shard_indices == {"shard-0": (0, 4), "shard-1": (4, 7), "shard-2": (7, 10)}
    with pytest.raises(IndexError):
        ds.rank_index_to_shard_index(2)
    assert ds.load_shard("shard-1")[0] == 4


def test_one_shard_at_a_time_and_the_next_prefetched() -> None:
    ds = make([3, 3, 3, 3], rank=0, world_size=1)
    assert [ds[i] for i in range(12)] == list(range(12))
    assert ds.peak_loaded_shards == 2 and ds.shards_opened == 4  # current + next, once each
    one = make([3, 3, 3, 3], prefetch=False)
    assert [one[i] for i in range(12)] == list(range(12)) and one.peak_loaded_shards == 1


def test_set_epoch_reshuffles_shards_and_samples_inside_them() -> None:
    shards = [5, 6, 7, 8]

    def epoch_order(epoch: int, rank: int) -> list[int]:
        ds = make(shards, rank, 2, shuffle=True, seed=11, shuffle_within_shard=True)
        ds.set_epoch(epoch)
        return [ds[i] for i in range(len(ds))]

    orders = {e: epoch_order(e, 0) + epoch_order(e, 1) for e in (0, 1, 2)}
    for order in orders.values():
        assert sorted(order) == list(range(26))  # a partition of all 26 (none dropped)
    assert len({tuple(o) for o in orders.values()}) == 3  # each epoch its own order
    assert orders[1] == epoch_order(1, 0) + epoch_order(1, 1)  # deterministic
    plain = make(shards, 0, 2, shuffle=True, seed=11)  # shard order only: runs stay stored
    where = [plain.rank_index_to_shard_index(i) for i in range(len(plain))]
    assert all(b[1] == a[1] + 1 for a, b in zip(where, where[1:], strict=False)
               if a[0] == b[0])


def test_a_distributed_sampler_on_top_is_refused_with_the_docs_warning() -> None:
    ds = make([5, 5], rank=0, world_size=1)
    with pytest.raises(ConfigError, match="do NOT use PyTorch's DistributedSampler"):
        DistributedSampler(ds, num_replicas=2, rank=0)  # the original gave 5 of 10
    from accelerate.data_loader import BatchSamplerShard

    shard = BatchSamplerShard(BatchSampler(SequentialSampler(ds), 2, False), 2, 0)
    with pytest.raises(ConfigError, match="BatchSamplerShard over a DistributedSharded"):
        list(DataLoader(ds, batch_sampler=shard))
    assert list(DataLoader(ds, sampler=ResumableSequentialSampler(ds), batch_size=5)
                )[1].tolist() == [5, 6, 7, 8, 9]  # the documented way still works


def test_resumable_sequential_sampler_as_documented() -> None:
    sampler = ResumableSequentialSampler(range(100))
    assert list(sampler) == list(range(100))
    sampler = ResumableSequentialSampler(range(10), start_index=1)
    assert next(iter(sampler)) == 1 and len(sampler) == 9


def run(sampler: ResumableSequentialSampler, ds: Any, batches: int | None = None
        ) -> list[int]:
    out: list[int] = []
    for k, batch in enumerate(DataLoader(ds, sampler=sampler, batch_size=1)):
        out += batch.tolist()
        if k + 1 == batches:
            break  # as a job that stops after saving
    return out


def test_resumed_mid_shard_continues_exactly() -> None:
    shards = [5, 4, 6]

    def fresh() -> DistributedShardedDataset:
        ds = make(shards, rank=1, world_size=2, shuffle=True, seed=3,
                  shuffle_within_shard=True)
        ds.set_epoch(2)
        return ds

    whole = run(ResumableSequentialSampler(fresh()), fresh())
    first = fresh()
    shard_of = [first.rank_index_to_shard_index(i)[0] for i in range(len(first))]
    stop = next(i for i in range(2, len(first)) if shard_of[i - 1] == shard_of[i])
    sampler = ResumableSequentialSampler(first)
    head = run(sampler, first, batches=stop)  # stops inside a shard
    state = json.loads(json.dumps(sampler.state_dict()))
    assert state["consumed"] == stop and state["extra"] == {"epoch": 2}

    again = make(shards, rank=1, world_size=2, shuffle=True, seed=3,
                 shuffle_within_shard=True)  # a new process: epoch 0 until the state says 2
    resumed = ResumableSequentialSampler(again)
    resumed.load_state_dict(state)
    assert head + run(resumed, again) == whole
    by_index = ResumableSequentialSampler(fresh(), start_index=stop)  # the original's way
    assert head + run(by_index, by_index.data_source) == whole

    other = ResumableSequentialSampler(make(shards, rank=0, world_size=2, shuffle=True,
                                            seed=3, shuffle_within_shard=True))
    with pytest.raises(StateError, match="rank: state has 1, this reader has 0"):
        other.load_state_dict(state)
