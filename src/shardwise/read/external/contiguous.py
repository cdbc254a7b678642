"""Contiguous placement: rank ``r`` reads the ``r``-th contiguous equal slice of a
collection of map-style shard datasets, one shard in memory at a time.

Why: some corpora are already split into per-file datasets of any kind (an Arrow file, an
image folder, a pickled list — anything with ``__len__``/``__getitem__``). Giving each rank
a contiguous run of shards means a rank opens only the shards it reads, one after the
other, instead of every rank opening every file.

How: the shards are put in a deterministic order (sorted by ``key``, or sorted and then
permuted by a keyed :class:`~shardwise.plan.permutation.Permutation` of ``seed``), their
lengths are concatenated into one global index space, and rank ``r`` of ``R`` takes
``[r·n, (r+1)·n)`` with ``n = total // R``. The ``total % R`` trailing examples are
dropped (``ds.dropped``, shown in ``repr``) so every rank runs the same number of steps.
Worked example, shard lengths ``[4, 0, 3, 5]`` and ``R = 3``::

    global   0 1 2 3 | 4 5 6 | 7 8 9 10 11      total 12, n = 4, dropped 0
    shard    a a a a | c c c | d d d d  d       (b is empty)
    rank     0 0 0 0 | 1 1 1   1 2 2 2  2       rank 1 opens c then d; rank 0 only a

Only the shard holding the current index is loaded, plus the next one of this rank's
slice, loaded by a background thread
(:class:`~shardwise.read.external.one_ahead.OneAhead`). Seeking to any index is a binary
search over the cumulative lengths: O(log shards), no shard before it is opened.

The dataset is already this rank's share (``is_sharded = True``): a sampler that shards
again (torch's ``DistributedSampler``, accelerate's ``BatchSamplerShard``) would make each
rank read ``1/R`` of its own share. :func:`~shardwise.read.guard.check_sampler` refuses such
samplers; use :class:`ContiguousSampler` (resumable) or any plain per-rank sampler.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from shardwise.checkpoint import Configured, as_count, check_not_past_end, fingerprint
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.plan.permutation import Permutation
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.external.one_ahead import OneAhead
from shardwise.read.guard import GuardedReader, refuse_sharding_sampler
from shardwise.world import World


class SizedDataset(Protocol):
    """What ``make_shard`` returns: any map-style dataset."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...



class Order(Choice):
    """``sorted``: by ``key``. ``shuffled``: sorted, then permuted by ``seed``."""

    __option__ = "order"

    SORTED = "sorted"
    SHUFFLED = "shuffled"



def shard_order(keys: Sequence[Any], order: Order, seed: int, epoch: int = 0) -> list[int]:
    """Positions into ``keys`` in reading order (``epoch``'s order when shuffled);
    independent of the order of ``keys``."""
    ranked = sorted(range(len(keys)), key=lambda i: keys[i])
    for a, b in zip(ranked, ranked[1:], strict=False):
        if keys[a] == keys[b]:
            raise ConfigError(f"two shards have the same sort key {keys[a]!r}: their order "
                              "would depend on the order of the list; pass distinct "
                              "sources or a key= that tells them apart")
    if order is Order.SORTED or len(ranked) < 2:
        return ranked
    perm = Permutation(len(ranked), seed, epoch)(np.arange(len(ranked)))
    return [ranked[int(p)] for p in perm]


def _check_lengths(lengths: Sequence[int], n: int) -> list[int]:
    out = list(lengths)
    if len(out) != n:
        raise ConfigError(f"lengths= has {len(out)} entries for {n} shards; give one length "
                          "per source, in the order of the sources")
    return [as_count(v, f"lengths[{i}]", error=ConfigError) for i, v in enumerate(out)]


class ContiguousShards(GuardedReader, Configured):
    """Rank ``r``'s contiguous equal slice of the concatenated shards; map-style.

    ``make_shard(source)`` builds one shard dataset. Lengths come from ``lengths=`` (one
    per source, in the order given; checked when a shard is opened), else each shard is
    built once at construction just to read its ``len`` (one at a time, on every rank: the
    start-up cost is one ``make_shard`` per source — pass ``lengths`` for large
    collections). ``key`` sorts the sources (default ``str``).

    ``set_epoch(e)`` re-permutes the shard order with ``(seed, e)`` (``order="shuffled"``)
    and, with ``shuffle_within=True``, the examples inside each shard by a keyed
    permutation of the shard's key (O(1) per index, nothing materialised); a rank's slice
    follows the new order. ``prefetch=False`` keeps exactly one shard in memory.

    >>> ds = ContiguousShards(sorted(glob("shards/*.arrow")), load_arrow,      # doctest: +SKIP
    ...                       world=World(1, 4), order="shuffled", seed=7)
    >>> len(ds), ds.dropped, ds[0]                                            # doctest: +SKIP
    """

    is_sharded = True

    def __init__(self, sources: Sequence[Any], make_shard: Callable[[Any], SizedDataset], *,
                 world: World | None = None, order: str | Order = "sorted", seed: int = 0,
                 key: Callable[[Any], Any] | None = None,
                 lengths: Sequence[int] | None = None, shuffle_within: bool = False,
                 prefetch: bool = True) -> None:
        given = list(sources)
        if not given:
            raise ConfigError("ContiguousShards needs at least one source")
        self.world = World.resolve(world, reader="ContiguousShards")
        self.order = Order.parse(order)
        self.seed, self.shuffle_within, self.prefetch_next = seed, shuffle_within, prefetch
        self._make_shard = make_shard
        self._declared = lengths is not None
        lens = (_check_lengths(lengths, len(given)) if lengths is not None
                else [len(make_shard(s)) for s in given])
        self._given = list(zip(given, lens, [(key or str)(s) for s in given], strict=True))
        self._perm: tuple[int, Permutation] | None = None
        self._arrange(0)
        self._shards: OneAhead[int, SizedDataset] = OneAhead(self._open)

    def _arrange(self, epoch: int) -> None:
        positions = shard_order([k for _, _, k in self._given], self.order, self.seed, epoch)
        self.epoch = epoch
        self.sources = [self._given[p][0] for p in positions]
        self.keys = [self._given[p][2] for p in positions]
        self.lengths = np.asarray([self._given[p][1] for p in positions], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.total = int(self.offsets[-1])
        mine, self.dropped = self.world.contiguous(self.total)
        self.start, self.stop = mine.start, mine.stop
        self._perm = None

    def set_epoch(self, epoch: int) -> None:
        """Read in epoch ``epoch``'s order (see the class docstring); releases the shards
        held, whose positions change."""
        epoch = as_count(epoch, "epoch", error=ConfigError)
        if epoch != self.epoch:
            self._shards.close()
            self._shards = OneAhead(self._open)
            self._arrange(epoch)

    def within(self, s: int, local: int) -> int:
        """The stored index inside shard ``s`` of its ``local``-th example this epoch."""
        if not self.shuffle_within:
            return local
        if self._perm is None or self._perm[0] != s:
            key = zlib.crc32(f"{self.seed}:{self.keys[s]}".encode())
            self._perm = (s, Permutation(int(self.lengths[s]), key, self.epoch))
        return int(self._perm[1](local))

    def __len__(self) -> int:
        refuse_sharding_sampler(self, "ContiguousShards")  # a sampler must not split it again
        return self.stop - self.start

    def state_config(self) -> dict[str, Any]:
        """The shards in their order (names and lengths) and this rank's slice of them."""
        return {"order": self.order.value, "seed": self.seed, "total": self.total,
                "shards": fingerprint({"keys": [str(k) for _, _, k in self._given],
                                       "lengths": [n for _, n, _ in self._given]}),
                "rank": self.world.rank, "world_size": self.world.size}

    def __repr__(self) -> str:
        w = self.world
        return (f"ContiguousShards({len(self.sources)} shards, {self.total} examples, "
                f"order={self.order.value!r}, epoch {self.epoch}, rank {w.rank} of {w.size}: "
                f"[{self.start}, {self.stop}), {describe_drops(self.drops())})")

    def drops(self) -> list[Drop]:
        """The trailing ``total % world size`` examples no rank reads (every rank gets
        the same count, so all run the same number of steps)."""
        return [Drop(self.dropped, "examples", f"the tail of {self.total:,} that does not "
                     f"split evenly over {self.world.size} ranks", of=self.total)
                ] if self.dropped else []

    @property
    def peak_loaded_shards(self) -> int:
        """The most shards this object has held at once (current + prefetched)."""
        return self._shards.peak_held

    @property
    def shards_opened(self) -> int:
        """How many times ``make_shard`` was called after construction."""
        return self._shards.loads

    def locate(self, index: int) -> tuple[int, int]:
        """This rank's ``index`` → ``(shard position, index inside the shard)``; O(log n)."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"index must be an integer, got {type(index).__name__}")
        n = self.stop - self.start
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for rank {self.world.rank}'s "
                             f"{n} examples")
        g = self.start + i
        s = int(np.searchsorted(self.offsets, g, side="right")) - 1
        return s, g - int(self.offsets[s])

    def __getitem__(self, index: int) -> Any:
        s, local = self.locate(index)
        shard = self._shards.get(s)
        nxt = s + 1
        while nxt < len(self.lengths) and self.lengths[nxt] == 0:
            nxt += 1
        if self.prefetch_next and nxt < len(self.lengths) and self.offsets[nxt] < self.stop:
            self._shards.prefetch(nxt)
        return shard[self.within(s, local)]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[i] for i in indices]

    _getitems = __getitems__  # Grain's batched read (see read/rows.py)

    def _open(self, s: int) -> SizedDataset:
        shard = self._make_shard(self.sources[s])
        if len(shard) != self.lengths[s]:
            where = "lengths=" if self._declared else "its length at construction"
            raise ConfigError(f"shard {self.sources[s]!r} has {len(shard)} examples but "
                              f"{where} said {int(self.lengths[s])}; fix the lengths or the "
                              "shard (the data changed?)")
        return shard

    def close(self) -> None:
        self._shards.close()

    def __enter__(self) -> ContiguousShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ContiguousSampler:
    """This rank's indices ``start, start + 1, …, len(ds) - 1``, in order.

    Stateless, like :class:`~shardwise.read.sampler.BatchSampler`: to resume, build it with
    the number of examples this rank has *received* (not what a DataLoader prefetched).
    Seeking costs one binary search in the dataset, never a read of earlier shards.
    """

    def __init__(self, ds: SizedDataset, start: int = 0) -> None:
        n = len(ds)
        start = as_count(start, "start")
        check_not_past_end(start, n, "examples", "this rank's share")
        self.n, self.start = n, start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.n))

    def __len__(self) -> int:
        return self.n - self.start


__all__ = ["ContiguousSampler", "ContiguousShards", "Order", "SizedDataset", "shard_order"]
