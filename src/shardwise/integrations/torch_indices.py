"""The index stream a :class:`~shardwise.integrations.torch.ShardwiseLoader` hands torch:
this rank's micro-batches (``_Indices``, its batch sampler, with the look-ahead that
prefetches a remote cache's chunks) and the same indices flattened (:class:`PlacedSampler`,
its ``sampler``, which tells frameworks the loader is placed already)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

from torch.utils.data import DistributedSampler

from shardwise.read.guard import refuse_framework_sharding
from shardwise.read.sampler import BatchSampler

MAX_LOOK_AHEAD = 1024  # micro-batches whose indices the adaptive look-ahead holds at most


def look_ahead(batches: Iterator[list[int]], prefetch: Callable[[list[int]], bool | None],
               ahead: int | None) -> Iterator[list[int]]:
    """``batches`` unchanged, with ``prefetch(batch)`` called before each is handed on, so
    its chunks download while earlier batches are read.

    ``ahead`` batches early (a fixed look-ahead)::

        ahead=2:  prefetch b0, b1, b2 → yield b0 → prefetch b3 → yield b1 → …

    or, ``ahead=None``, as early as the cache asks: ``prefetch`` returns True while the
    cache's downloads ahead are fewer than its measured latency and reading pace need
    (:mod:`shardwise.storage.prefetch`), and then the next batch is prefetched before
    one is handed on; so the window grows until the latency is hidden (or ``local_bytes``
    is reached), and stays there (at most :data:`MAX_LOOK_AHEAD` batches)::

        wants more: prefetch b0 → prefetch b1 → prefetch b2 (enough) → yield b0 →
                    prefetch b3 (enough) → yield b1 → prefetch b4 (wants more) → …
    """
    window: collections.deque[list[int]] = collections.deque()
    for batch in batches:
        more = prefetch(batch)
        window.append(batch)
        if ahead is not None:
            if len(window) > ahead:
                yield window.popleft()
        elif not more or len(window) > MAX_LOOK_AHEAD:
            yield window.popleft()
    yield from window


class _Indices:
    """The batch sampler handed to torch: a mutable holder, so a restored position takes
    effect on the next ``iter()`` (also with persistent workers). ``prefetch`` (a
    dataset's, for a cache on an object store) sees each batch ``ahead`` batches early
    (None: as early as the cache asks; 0: never)."""

    def __init__(self, sampler: BatchSampler,
                 prefetch: Callable[[list[int]], bool | None] | None = None,
                 ahead: int | None = 0) -> None:
        self.sampler = sampler
        self.start = sampler.consumed
        self.received = 0  # micro-batches handed to the caller since ``start``
        self.prefetch, self.ahead = prefetch, ahead
        self.stopped = False  # set to end the current index stream early (see _drain)

    def __iter__(self) -> Iterator[list[int]]:
        refuse_framework_sharding("a shardwise loader's batch sampler")
        self.stopped = False
        batches = iter(self.sampler)
        if self.prefetch is not None and self.ahead != 0:
            batches = look_ahead(batches, self.prefetch, self.ahead)
        return self._until_stopped(batches)

    def _until_stopped(self, batches: Iterator[list[int]]) -> Iterator[list[int]]:
        for batch in batches:
            if self.stopped:
                return
            yield batch

    def __len__(self) -> int:
        return len(self.sampler)


class PlacedSampler(DistributedSampler):  # type: ignore[type-arg]
    """What a :class:`ShardwiseLoader`'s ``sampler`` answers: this rank's example indices,
    already placed (its micro-batches, flattened, from the loader's position on).

    Why a ``DistributedSampler``: frameworks inject one unless the loader's sampler
    already is one (Lightning Fabric's ``setup_dataloaders``, Lightning's Trainer:
    ``_requires_distributed_sampler``), and injecting into a custom batch sampler fails
    ("can't inject a (distributed) sampler into your batch sampler"). This one tells them
    the loader is placed; the loader itself still walks its batch sampler. It never runs
    ``DistributedSampler``'s own code (which would shard the dataset again)."""

    def __init__(self, indices: _Indices) -> None:  # not super().__init__: see above
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
    """Mixin of a ``DataLoader`` walking an ``_Indices`` batch sampler: its ``sampler`` is
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


__all__ = ["MAX_LOOK_AHEAD", "PlacedLoader", "PlacedSampler", "look_ahead"]
