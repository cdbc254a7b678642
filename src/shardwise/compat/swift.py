"""ms-swift's ``LazyShardedDataset`` (the plan's signature), over
:class:`~shardwise.read.external.producer_dir.ProducerDirDataset`.

A producer writes ``chunk_00000.jsonl``, ``chunk_00001.jsonl``, … into a shared directory
while training runs; rank ``r`` of ``R`` reads only the chunks with
``chunk_idx % R == r``, so no rank reads samples for the others::

    ms-swift (plan)                                  shardwise
    LazyShardedDataset(directory, encode_fn,         ProducerDirDataset(directory,
        chunk_pattern=r'chunk_(\\d+)\\.jsonl',            map_fn=encode_fn, pattern=…,
        samples_per_chunk=1000,                          records_per_chunk=…,
        max_samples=10_000_000,                          (len = the declared count)
        wait_poll_interval=5.0,                          poll_interval=…,
        max_wait_time=0,                                 timeout=… (math.inf = for ever),
        mark_completed=True,                             done_marker=…, marker=".completed",
        world_size=None, rank=None)                      world=World(rank, size) | None)

    from shardwise.compat.swift import LazyShardedDataset        # the only change
    ds = LazyShardedDataset("/shared/chunks", template.encode, samples_per_chunk=512)

Kept from the plan: ``len(ds) == max_samples`` (an upper bound: training stops by
``max_steps``), the world from torch.distributed when ``world_size``/``rank`` are not
given (:meth:`World.resolve <shardwise.world.World.resolve>`), index ``i`` is sample
``i % samples_per_chunk`` of this rank's chunk ``i // samples_per_chunk`` (global chunk
``rank + (i // samples_per_chunk) · world_size``), ``max_wait_time=0`` waits for ever,
``encode_fn(sample, return_length=True)`` when ``encode_fn`` accepts that keyword (its
signature is inspected once), a ``<chunk>.completed`` marker so the producer can delete a
chunk, and ``evict_chunk``.

Where the plan loses or repeats data, this class does better:

* **BatchSamplerShard.** HF Trainer (accelerate) wraps the batch sampler in
  ``BatchSamplerShard``, which deals batch ``k`` of ``range(len(ds))`` to rank
  ``k % R``. The plan reads every index as local to its rank, so with batch size ``B``
  rank 0 receives local indices ``[0, B)``, ``[2B, 3B)``, … and never ``[B, 2B)`` (those go
  to rank 1, which reads *its own* ``[B, 2B)``): each rank silently trains on half its
  samples. Here ``__len__`` sees the sharding sampler among its callers (accelerate's
  ``BatchSamplerShard``, or torch's ``DistributedSampler`` without shuffle) and the
  dataset maps the indices that sampler deals this rank back to ``0, 1, 2, …``: with
  ``b`` indices per rank per round (``B``, or ``B / R`` with ``split_batches``), global
  index ``g`` is local ``(g // (b·R))·b + g % b``. So each rank receives every sample of
  its chunks exactly once, in order, whether or not accelerate shards again. A sampler
  for another world, a shuffling one (``RandomSampler``, ``DistributedSampler(shuffle=
  True)``: chunks arrive in order, random indices would wait on chunks far ahead), or an
  index dealt to another rank is refused with :class:`ConfigError`.
* **Markers** are written once every sample of the chunk has been *returned*, not when
  it is loaded: a crash between the two would otherwise let the producer delete samples
  never trained on. A chunk that is gone while its marker exists raises (the plan
  silently moves on to the next chunk).
* **Bad input is named**: invalid JSON, or an ``encode_fn`` that raises or returns
  ``None``, is an :class:`~shardwise.errors.InputError` with file and line (the plan
  logs three warnings and drops the samples, shifting every later index).
* **A short chunk never wraps around**: an index past the samples a chunk holds raises
  ``IndexError`` naming file and counts (the plan returns ``samples[offset % len]``, a
  duplicate). Declare exact per-chunk counts in ``_EXPECTED`` for a short last chunk.
* **Timeouts are errors**: ``max_wait_time > 0`` raises
  :class:`~shardwise.errors.ProducerTimeoutError` naming the chunk and what was published
  (the plan returns ``[]`` and falls through to the next chunk).
* Chunk files are written under a temporary name and renamed (see
  :mod:`~shardwise.read.external.producer_dir`); the plan's 1 s mtime wait is not needed.
* DataLoader workers are refused (each would load the chunk and none would see all of
  it, so no marker): use ``num_workers=0`` (``--dataloader_num_workers 0``).
"""

from __future__ import annotations

import inspect
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError
from shardwise.read.external.producer_dir import ProducerDirDataset
from shardwise.read.guard import sampler_over
from shardwise.world import World

COMPLETED = ".completed"
_SAMPLERS = ("BatchSamplerShard", "DistributedSampler", "RandomSampler")


def _accepts_return_length(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(p.name == "return_length" or p.kind is p.VAR_KEYWORD for p in params)


class _Encode:
    """``encode_fn`` called as the plan calls it; ``None`` is refused (named by the
    reader as file:line), since a dropped sample would shift every later index."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.return_length = fn, _accepts_return_length(fn)

    def __call__(self, sample: dict[str, Any]) -> Any:
        out = self.fn(sample, return_length=True) if self.return_length else self.fn(sample)
        if out is None:
            raise ValueError("encode_fn returned None; a dropped sample would shift every "
                             "later index of the chunk. Filter in the producer, or return "
                             "a sample")
        return out


@dataclass(frozen=True)
class Dealing:
    """How a sharding sampler deals indices: ``block`` consecutive indices to each of
    ``size`` ranks in turn; this is ``rank``'s share."""

    block: int
    size: int
    rank: int

    def local(self, g: int) -> int:
        """Global index ``g`` → this rank's position among the indices dealt to it."""
        rnd, off = divmod(g, self.block * self.size)
        owner, within = divmod(off, self.block)
        if owner != self.rank:
            raise ConfigError(f"index {g} is dealt to rank {owner} of {self.size} (blocks of "
                              f"{self.block}), not to this rank {self.rank}: the sampler "
                              "does not deal indices the way it did when len() was taken")
        return rnd * self.block + within


def dealing_of(sampler: Any, world: World, n: int, local: dict[str, Any]) -> Dealing:
    """The :class:`Dealing` of accelerate's BatchSamplerShard or torch's unshuffled
    DistributedSampler over ``n`` indices; ConfigError for samplers that shuffle, serve
    another world, or would pad the last round with the first indices again. ``local``:
    the locals of the sampler's call (torch's DistributedSampler asks ``len`` in
    ``__init__`` before it sets ``shuffle``)."""
    names = {c.__name__ for c in type(sampler).__mro__}
    if "BatchSamplerShard" in names:
        size, rank, b = sampler.num_processes, sampler.process_index, sampler.batch_size
        if b is None:
            raise ConfigError("BatchSamplerShard over a batch sampler without batch_size: "
                              "the indices dealt to each rank cannot be known")
        dealing = Dealing(b // size if sampler.split_batches else b, size, rank)
        pads = sampler.even_batches and not sampler.drop_last
    elif "DistributedSampler" in names and not getattr(sampler, "shuffle",
                                                        local.get("shuffle", True)):
        dealing = Dealing(1, sampler.num_replicas, sampler.rank)
        pads = not sampler.drop_last
    else:
        raise ConfigError(f"{type(sampler).__name__} draws random indices, but "
                          "LazyShardedDataset serves each rank's chunks in the order the "
                          "producer writes them (a random index waits for a chunk far "
                          "ahead). Use a SequentialSampler (HF: TrainingArguments("
                          "train_sampling_strategy='sequential'); ms-swift: "
                          "--train_dataloader_shuffle false)")
    if (dealing.size, dealing.rank) != (world.size, world.rank):
        raise ConfigError(f"{type(sampler).__name__} deals to rank {dealing.rank} of "
                          f"{dealing.size}, but this dataset reads for {world}; give both "
                          "the same world")
    step = dealing.block * dealing.size
    if pads and n % step:
        raise ConfigError(f"max_samples={n} is not a multiple of {step} (indices per rank "
                          f"per round × {dealing.size} ranks): {type(sampler).__name__} "
                          "would pad the last round with the first samples again. Set "
                          f"max_samples to a multiple of {step}, e.g. {n - n % step}, or "
                          "drop_last=True (dataloader_drop_last)")
    return dealing


class LazyShardedDataset:
    """ms-swift's map-style producer-directory dataset; see the module docstring.

    >>> ds = LazyShardedDataset("/shared/chunks", template.encode,     # doctest: +SKIP
    ...                         samples_per_chunk=512, max_wait_time=0)
    >>> ds[0]["length"]                                              # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike[str],
                 encode_fn: Callable[..., Any] | None,
                 chunk_pattern: str | re.Pattern[str] = r"chunk_(\d+)\.jsonl",
                 samples_per_chunk: int = 1000, max_samples: int = 10_000_000,
                 wait_poll_interval: float = 5.0, max_wait_time: float = 0,
                 mark_completed: bool = True, world_size: int | None = None,
                 rank: int | None = None) -> None:
        max_samples = as_count(max_samples, "max_samples", error=ConfigError)
        if not max_wait_time >= 0:
            raise ConfigError(f"max_wait_time must be >= 0 (0 waits for ever), got "
                              f"{max_wait_time!r}")
        self.max_samples, self.samples_per_chunk = max_samples, samples_per_chunk
        self.dataset = ProducerDirDataset(
            directory, map_fn=None if encode_fn is None else _Encode(encode_fn),
            world=_world(world_size, rank), pattern=chunk_pattern,
            records_per_chunk=samples_per_chunk,
            timeout=max_wait_time or math.inf, poll_interval=wait_poll_interval,
            done_marker=mark_completed, marker=COMPLETED)
        self.dealing: Dealing | None = None
        self.directory = self.dataset.directory  # the plan's attribute names
        self.world_size, self.rank = self.dataset.world.size, self.dataset.world.rank

    def __len__(self) -> int:
        found = sampler_over(self, _SAMPLERS)
        if found is not None:
            self.dealing = dealing_of(found[0], self.dataset.world, self.max_samples,
                                      found[1])
        return self.max_samples

    def local_index(self, idx: int) -> int:
        """The index into this rank's samples that sampler index ``idx`` stands for."""
        if isinstance(idx, bool) or not isinstance(idx, int) and not hasattr(idx, "__index__"):
            raise TypeError(f"index must be an integer, got {type(idx).__name__}")
        i = int(idx)
        if not 0 <= i < self.max_samples:
            raise IndexError(f"index {idx} out of range for max_samples={self.max_samples}")
        return i if self.dealing is None else self.dealing.local(i)

    def __getitem__(self, idx: int) -> Any:
        if _in_worker():
            raise ConfigError("LazyShardedDataset under DataLoader workers: each worker would "
                              "load the chunk and none would return all of it, so no "
                              ".completed marker would be written. Use num_workers=0 "
                              "(ms-swift: --dataloader_num_workers 0)")
        return self.dataset[self.local_index(idx)]

    def chunk_of(self, idx: int) -> tuple[int, int]:
        """Sampler index ``idx`` → ``(global chunk index, sample in the chunk)``."""
        return self.dataset.position(self.local_index(idx))

    def evict_chunk(self, chunk_idx: int) -> None:
        """Release chunk ``chunk_idx`` from memory (it reloads if asked for again); its
        marker is still written only once every sample of it has been returned."""
        self.dataset._chunks.evict(chunk_idx)

    def loaded_chunks(self) -> list[int]:
        return self.dataset.loaded_chunks()

    def close(self) -> None:
        self.dataset.close()

    def __repr__(self) -> str:
        return (f"LazyShardedDataset(max_samples={self.max_samples}, dealing={self.dealing}, "
                f"{self.dataset!r})")


def _world(world_size: int | None, rank: int | None) -> World | None:
    if world_size is None and rank is None:
        return None  # World.detect(): torch.distributed, then RANK/WORLD_SIZE
    detected = World.detect()
    return World(detected.rank if rank is None else rank,
                 detected.size if world_size is None else world_size)


def _in_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None
