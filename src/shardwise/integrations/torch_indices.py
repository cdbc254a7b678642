"""What a :class:`~shardwise.integrations.torch.ShardwiseLoader` answers as its ``sampler``:
the indices of its index stream (:class:`shardwise.read.loader.IndexStream`, its batch
sampler) flattened (:class:`PlacedSampler`), which tells frameworks the loader is placed
already."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler

from shardwise.read.loader import IndexStream


class PlacedSampler(DistributedSampler):  # type: ignore[type-arg]
    """What a :class:`ShardwiseLoader`'s ``sampler`` answers: this rank's example indices,
    already placed (its micro-batches, flattened, from the loader's position on).

    Why a ``DistributedSampler``: frameworks inject one unless the loader's sampler
    already is one (Lightning Fabric's ``setup_dataloaders``, Lightning's Trainer:
    ``_requires_distributed_sampler``), and injecting into a custom batch sampler fails
    ("can't inject a (distributed) sampler into your batch sampler"). This one tells them
    the loader is placed; the loader itself still walks its batch sampler. It never runs
    ``DistributedSampler``'s own code (which would shard the dataset again)."""

    def __init__(self, indices: IndexStream) -> None:  # not super().__init__: see above
        self._indices = indices
        world = indices.sampler.world
        self.num_replicas, self.rank, self.epoch = world.size, world.rank, 0
        self.shuffle, self.drop_last, self.seed = False, True, 0

    def __iter__(self) -> Iterator[int]:
        for batch in self._indices.sampler:
            yield from batch

    def __len__(self) -> int:
        return len(self._indices) * self._indices.sampler.micro_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Nothing to do: an epoch of shardwise's order is a range of positions (each
        reshuffled by the dataset), and every ``iter()`` continues from the position."""
        self.epoch = epoch


class PlacedLoader:
    """Mixin of a ``DataLoader`` walking an ``IndexStream`` batch sampler: its ``sampler`` is
    that placement (``self._placed``, a :class:`PlacedSampler`), so a framework that would
    inject a distributed sampler sees the loader is placed already."""

    _placed: PlacedSampler

    @property
    def sampler(self) -> PlacedSampler:
        return self._placed

    @sampler.setter
    def sampler(self, value: object) -> None:
        """DataLoader's ``__init__`` sets its default sampler; this loader's is its
        placement, so the default is not kept."""


__all__ = ["PlacedLoader", "PlacedSampler"]
