"""llm.datasets' ``DistributedShardedDataset`` and ``ResumableSequentialSampler`` (the
documented signatures), over
:class:`~shardwise.read.external.contiguous.ContiguousShards`.

The shards (any map-style dataset type, built from ``(args, kwargs)``) are sorted by key,
or shuffled, and concatenated; rank ``r`` of ``R`` reads the ``r``-th contiguous equal
slice, one shard at a time::

    llm.datasets                                     shardwise
    DistributedShardedDataset(dataset_type,          ContiguousShards(sources=keys,
        shard_params, *, rank, world_size,               make_shard=…, world=World(rank, R),
        shuffle=False, seed=0)                           order="shuffled"|"sorted", seed=…)
    ResumableSequentialSampler(data_source,          ContiguousSampler(ds, start=…)
        start_index=0)                                   (+ state_dict / load_state_dict)

    from shardwise.compat.llm import DistributedShardedDataset, ResumableSequentialSampler
    ds = DistributedShardedDataset(ShardDataset, {"shard-0": ((path0,), {}), ...},
                                   rank=rank, world_size=world_size)
    sampler = ResumableSequentialSampler(ds, start_index=saved_index)

Kept from the original: ``len(ds) == total // world_size``, ``rank_index_to_global_index``
(``len(ds) · rank + i``), ``rank_index_to_shard_index`` (→ ``(shard key, index)``),
``load_shard(key)``, the last ``total % world_size`` samples dropped so every rank runs
the same steps — reported here in ``ds.drops()`` (``ds.dropped``) and ``repr(ds)``, not
only in a note.

The doc's TODOs, done: the next shard of this rank's slice is prefetched on a background
thread (at most two shards alive; ``prefetch=False`` keeps exactly one); ``set_epoch(e)``
re-shuffles the shard order per epoch (with ``shuffle=True``) and ``shuffle_within_shard=
True`` permutes the samples inside each shard per epoch, keyed by (seed, shard key), O(1)
per index. The shard order is shardwise's keyed permutation of the sorted keys, not
``random.shuffle`` after ``random.seed(seed)`` (which also reseeded the caller's global
RNG): the same ``seed`` gives another order than the original.

The doc warns: do NOT use a ``DistributedSampler`` — the dataset is already this rank's
share, and one on top silently reads ``1/world_size`` of it. Here that warning is the
error: ``len(ds)`` taken by a DistributedSampler (or accelerate's BatchSamplerShard) over
this dataset raises :class:`~shardwise.errors.ConfigError` (both ask ``len`` when they are
built or iterated, and ``__len__`` checks its callers).

The sampler's ``state_dict()`` is shardwise's one state protocol (kind, version,
fingerprint, consumed, config, extra) with ``consumed`` = the next index and the dataset's
epoch: ``load_state_dict`` continues exactly, mid-shard included, and refuses a state of
another dataset, rank or world size. ``consumed`` counts the indices the sampler handed
out, which is what the loop received with ``num_workers=0``; DataLoader workers prefetch,
so with workers pass ``state_dict(consumed=n)`` (n = samples the loop received, counted
from index 0 — the original's ``(batch_index + 1) · batch_size`` forgot ``start_index``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import Any

from shardwise.checkpoint import (
    LoaderState,
    Resumable,
    as_count,
    check_not_past_end,
    fingerprint,
)
from shardwise.errors import ConfigError
from shardwise.read.external.contiguous import ContiguousShards
from shardwise.read.guard import sampler_over
from shardwise.world import World

DatasetParams = tuple[tuple[Any, ...], Mapping[str, Any]]
STATE_KIND = "llm.ResumableSequentialSampler"
ORDER_VERSION = 1
_SHARDING = ("DistributedSampler", "BatchSamplerShard", "DistributedBatchSampler")
WARNING = ("When building a DataLoader from a DistributedShardedDataset, do NOT use "
           "PyTorch's DistributedSampler. If you want to be able to save the state of the "
           "data loader, use the SequentialSampler because this class already provides the "
           "support for partitioning samples across ranks. This module provides a "
           "ResumableSequentialSampler to enable resuming sampling from the last sampled "
           "index.")


class _Build:
    """``dataset_type(*args, **kwargs)`` for a shard key (picklable for DataLoader
    workers, unlike a closure)."""

    def __init__(self, dataset_type: type, shard_params: dict[str, DatasetParams]) -> None:
        self.dataset_type, self.shard_params = dataset_type, shard_params

    def __call__(self, key: str) -> Any:
        args, kwargs = self.shard_params[key]
        return self.dataset_type(*args, **kwargs)


class DistributedShardedDataset(ContiguousShards):
    """This rank's contiguous share of the shards; see the module docstring.

    >>> ds = DistributedShardedDataset(SimpleDataset, params, rank=0,    # doctest: +SKIP
    ...                                world_size=4, shuffle=True, seed=7)
    >>> len(ds), ds.dropped, ds.rank_index_to_shard_index(0)             # doctest: +SKIP
    """

    def __init__(self, dataset_type: type, shard_params: dict[str, DatasetParams], *,
                 rank: int, world_size: int, shuffle: bool = False, seed: int = 0,
                 shuffle_within_shard: bool = False, prefetch: bool = True) -> None:
        if not shard_params:
            raise ConfigError("Parameters for at least one shard must be provided "
                              "(shard_params is empty)")
        self.dataset_type, self.shard_params = dataset_type, shard_params
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        super().__init__(list(shard_params), _Build(dataset_type, shard_params),
                         world=World(rank, world_size),
                         order="shuffled" if shuffle else "sorted", seed=seed,
                         shuffle_within=shuffle_within_shard, prefetch=prefetch)
        self.total_samples = (self.stop - self.start) * world_size
        self.shard_keys = list(self.sources)

    def __len__(self) -> int:
        found = sampler_over(self, _SHARDING)
        if found is not None:
            sampler = found[0]
            n = getattr(sampler, "num_replicas", getattr(sampler, "num_processes", "R"))
            raise ConfigError(f"{type(sampler).__name__} over a DistributedShardedDataset "
                              f"would give rank {self.world.rank} only 1/{n} of its own "
                              f"share, silently. {WARNING}")
        return self.stop - self.start

    @property
    def shard_indices(self) -> dict[str, tuple[int, int]]:
        """Shard key → its ``[start, end)`` in the global index space this epoch (the last
        shard's end excludes the dropped tail)."""
        end = self.total - self.dropped
        return {k: (int(a), min(int(b), end)) for k, a, b
                in zip(self.sources, self.offsets[:-1], self.offsets[1:], strict=True)}

    def rank_index_to_global_index(self, rank_index: int) -> int:
        """An index local to this rank → its global index (``len · rank + i``)."""
        self.locate(rank_index)  # range check
        return self.start + int(rank_index)

    def rank_index_to_shard_index(self, rank_index: int) -> tuple[str, int]:
        """An index local to this rank → ``(shard key, index inside the shard)``, the index
        the shard is read at (after the in-shard shuffle, if any)."""
        s, local = self.locate(rank_index)
        return self.sources[s], self.within(s, local)

    def load_shard(self, shard_key: str) -> Any:
        args, kwargs = self.shard_params[shard_key]
        return self.dataset_type(*args, **kwargs)

    def state_config(self) -> dict[str, Any]:
        return {"shards": len(self.shard_params), "total": self.total,
                "keys_sha": fingerprint({"keys": sorted(self.shard_params)}),
                "rank": self.world.rank, "world_size": self.world.size,
                "shuffle": self.shuffle, "seed": self.seed,
                "shuffle_within_shard": self.shuffle_within, "order_version": ORDER_VERSION}

    def __repr__(self) -> str:
        return "Distributed" + super().__repr__().replace("ContiguousShards", "ShardedDataset")


class ResumableSequentialSampler(Resumable):
    """``start_index, start_index + 1, …, len(data_source) - 1``; ``index`` is the next
    index to hand out. State keys: ``consumed`` (that index), ``extra.epoch`` (the
    dataset's epoch, restored on load), ``config`` (the dataset's, or its length).

    >>> s = ResumableSequentialSampler(range(10), start_index=4)
    >>> list(s), len(s), s.index
    ([4, 5, 6, 7, 8, 9], 6, 10)
    """

    state_kind = STATE_KIND

    def __init__(self, data_source: Sized, start_index: int = 0) -> None:
        self.data_source = data_source
        self.data_length = len(data_source)
        start_index = as_count(start_index, "start_index", error=ConfigError)
        if start_index > self.data_length:
            raise ConfigError(f"start_index must be in [0, {self.data_length}] (the length "
                              f"of the data source), got {start_index}")
        self.start_index = start_index
        self.index = start_index

    def __iter__(self) -> Iterator[int]:
        while self.index < self.data_length:
            i = self.index
            self.index = i + 1  # counted when handed out, so a state after a batch is exact
            yield i

    def __len__(self) -> int:
        return self.data_length - self.start_index

    def state_config(self) -> dict[str, Any]:
        config = getattr(self.data_source, "state_config", None)
        return config() if callable(config) else {"length": self.data_length}

    def _position(self) -> tuple[int, dict[str, Any]]:
        return self.index, {"epoch": getattr(self.data_source, "epoch", 0)}

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from: ``consumed`` (default: the indices handed out;
        with DataLoader workers pass what the training loop received)."""
        state = super().state_dict()
        if consumed is not None:
            state["consumed"] = as_count(consumed, "consumed")
        return state

    def _seek(self, st: LoaderState) -> None:
        """Continue exactly where the state was saved (the dataset's epoch included)."""
        check_not_past_end(st.consumed, self.data_length, "samples", "this rank's share")
        (epoch,) = st.extra_counts("epoch")
        set_epoch = getattr(self.data_source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        elif epoch:
            name = type(self.data_source).__name__
            raise ConfigError(f"the state is of epoch {epoch}, but {name} has no set_epoch "
                              "to restore it")
        self.start_index = self.index = st.consumed
