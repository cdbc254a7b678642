"""Global placement: a map-style dataset of packed, shuffled token windows.

Example ``i`` of the global order is window ``π_e(i mod n)`` of epoch ``e = i // n``, where
``n`` is the number of windows of ``seq_len + 1`` tokens cut from the concatenated
documents (consecutive windows share one token) and ``π_e`` is a keyed permutation
evaluated per index (:mod:`shardwise.plan.permutation`). Nothing per epoch is
materialised: ``len(ds)`` is one epoch, and indices past it continue into later epochs,
each reshuffled, at no cost up front. ``get_batch`` assembles a whole micro-batch in one
call (stacked arrays); ``__getitems__`` returns the same as a list of per-example dicts
(torch's protocol, :class:`~shardwise.read.rows.Rows`). Index :data:`PAD` (-1) yields a
fully masked example (evaluation padding).

Only the chunks holding the requested windows are opened (memory-mapped, lazily).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import Configured
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.format.paths import reader_dir
from shardwise.plan.block_shuffle import BlockShuffle
from shardwise.plan.doc_shuffle import DOC_SHUFFLE_VERSION, DocShuffleIndex
from shardwise.plan.permutation import PERMUTATION_VERSION, Permutation
from shardwise.plan.windows import dropped_tokens, num_windows
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.epochs import EpochView
from shardwise.read.examples import NEXT_TOKEN
from shardwise.read.guard import GuardedReader
from shardwise.read.rows import ROW_FREE, Rows
from shardwise.read.tokens.assemble import DocRun, WindowReader
from shardwise.read.tokens.plans import load_or_build
from shardwise.storage.cache import Cache
from shardwise.storage.opening import reader_cache

PAD = -1
ORDER_VERSION = 1
ORDER_BLOCK = 4096
ORDER_BLOCKS_KEPT = 8


class Shuffle(Choice):
    """How the windows of an epoch are ordered.

    ``none``: stored order. ``window``: a keyed permutation of all windows (default).
    ``block``: blocks of consecutive windows permuted, then windows inside groups of
    blocks (read locality). ``document``: documents permuted before packing (Megatron
    style; its per-epoch index is cached as ``.npy`` and memory-mapped).
    """

    __option__ = "shuffle"

    NONE = "none"
    WINDOW = "window"
    BLOCK = "block"
    DOCUMENT = "document"



@dataclass(frozen=True)
class TokenConfig:
    """What defines the global order and the example layout (all of it is fingerprinted).

    ``reset_position_ids``, ``cu_seqlens`` and ``eod_mask_loss`` follow Megatron's
    reset_position_ids / reset_attention_mask / eod_mask_loss: positions restart at each
    document start, document boundaries are returned for variable-length attention, and
    positions whose *input* is the end-of-document token get zero loss.
    """

    seq_len: int
    seed: int = 0
    shuffle: Shuffle = Shuffle.WINDOW
    drop_last: bool = True
    block_size: int = 64
    blocks_per_group: int = 8
    reset_position_ids: bool = False
    cu_seqlens: bool = False
    eod_mask_loss: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ConfigError(f"seq_len must be a positive integer, got {self.seq_len!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.block_size < 1 or self.blocks_per_group < 1:
            raise ConfigError("block_size and blocks_per_group must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shuffle"] = self.shuffle.value
        return d


class TokenDataset(GuardedReader, EpochView, Configured):
    """Packed windows of a cache in a seeded global order; map-style.

    ``verify``: check ids and chunk checksums as they are read (default: as the cache was
    opened, which is on; ``False`` for a trusted cache; see
    :mod:`shardwise.storage.integrity`).

    >>> ds = TokenDataset(open_cache("cache/"), seq_len=2048, seed=1234)  # doctest: +SKIP
    >>> ds[0]["input_ids"].shape, len(ds)                                # doctest: +SKIP
    ((2048,), 48828)

    With ``drop_last`` (the default) the tokens after the last full window are left out:
    ``drops()`` and the ``repr`` say how many. Index :data:`PAD` is a masked example
    (``pads``), which an eval pass uses to fill its last step.
    """

    pads = True
    label_convention = NEXT_TOKEN  # labels are next-token targets: read/examples.py

    def __init__(self, cache: Cache | str | os.PathLike[str], *, seq_len: int, seed: int = 0,
                 shuffle: str | Shuffle = Shuffle.WINDOW, drop_last: bool = True,
                 block_size: int = 64, blocks_per_group: int = 8,
                 reset_position_ids: bool = False, cu_seqlens: bool = False,
                 eod_mask_loss: bool = False, plan_dir: str | os.PathLike[str] | None = None,
                 verify: bool | None = None) -> None:
        self.cache = reader_cache(cache, verify)
        self.config = TokenConfig(seq_len, seed, Shuffle.parse(shuffle), drop_last, block_size,
                                  blocks_per_group, reset_position_ids, cu_seqlens,
                                  eod_mask_loss)
        if eod_mask_loss and self.cache.eod_id is None:
            raise ConfigError("eod_mask_loss needs the cache's end-of-document id, and this "
                              "cache has none (build with --append-eod, or a tokenizer that "
                              "has an end-of-text token)")
        self._plan_dir = Path(plan_dir) if plan_dir is not None else None
        self._orders: dict[int, Any] = {}
        self._blocks: OrderedDict[tuple[int, int], npt.NDArray[np.int64]] = OrderedDict()
        # the last order block each caller used, as a list (see _window_list)
        self._last_block: dict[str, tuple[tuple[int, int], list[int]]] = {}
        self.num_windows = num_windows(self.cache.num_tokens, seq_len, drop_last=drop_last)
        if self.num_windows == 0:  # before the reader: it allocates seq_len positions
            raise ConfigError(f"the cache holds {self.cache.num_tokens} tokens: not one "
                              f"window of seq_len + 1 = {seq_len + 1} (lower seq_len, or "
                              "pass drop_last=False)")
        self._reader = WindowReader(self.cache, self.config)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for spawned DataLoader workers: the order caches stay behind (a document
        shuffle's memory-mapped plan would pickle as a copy); the worker rebuilds or maps
        them again on use."""
        d = dict(self.__dict__)
        d["_orders"], d["_blocks"], d["_last_block"] = {}, OrderedDict(), {}
        return d

    # -- identity -------------------------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        """The plain fields a checkpoint must match (shown when a state is refused)."""
        return {**self.config.to_dict(), "cache": self.cache.fingerprint,
                "cache_tokens": self.cache.num_tokens, "order_version": ORDER_VERSION,
                "permutation_version": PERMUTATION_VERSION}

    def __len__(self) -> int:
        return self.num_windows

    def __repr__(self) -> str:
        c = self.config
        return (f"TokenDataset({self.cache!r}, seq_len={c.seq_len}, seed={c.seed}, "
                f"shuffle={c.shuffle.value!r}, windows={self.num_windows}, "
                f"{describe_drops(self.drops())})")

    def drops(self) -> list[Drop]:
        """The tokens no window holds (the last partial window, under ``drop_last``)."""
        c, total = self.config, self.cache.num_tokens
        n = dropped_tokens(total, c.seq_len, drop_last=c.drop_last)
        return [Drop(n, "tokens", "after the last full window (drop_last=True)", of=total)
                ] if n else []

    # -- order ------------------------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> Any:
        order = self._orders.get(epoch)
        if order is None:
            c, n = self.config, self.num_windows
            if c.shuffle is Shuffle.WINDOW:
                order = Permutation(n, c.seed, epoch)
            elif c.shuffle is Shuffle.BLOCK:
                order = BlockShuffle(n, c.seed, epoch, c.block_size, c.blocks_per_group)
            elif c.shuffle is Shuffle.DOCUMENT:
                order = self._doc_index(epoch)
            if len(self._orders) >= 4:
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = order
        return order

    def windows(self, indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Global example indices → window indices of their epoch (shuffle none/window/
        block). A pure function of the indices; evaluated per block of
        ``ORDER_BLOCK`` consecutive positions and kept in a small LRU (a sampler reads
        consecutive positions), so the Feistel rounds cost ~0.1 us per example, and memory
        stays O(block), never O(epoch)."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.config.shuffle is Shuffle.NONE:
            return idx % self.num_windows
        epochs, pos = np.divmod(idx, self.num_windows)
        blocks = pos // ORDER_BLOCK
        if idx.size and idx.ndim == 1:  # a micro-batch: one epoch and block, the usual case
            e0, b0 = int(epochs[0]), int(blocks[0])
            if (epochs == e0).all() and (blocks == b0).all():
                return self._order_block(e0, b0)[pos - b0 * ORDER_BLOCK]
        out = np.empty_like(pos)
        for e, b in set(zip(epochs.tolist(), blocks.tolist(), strict=True)):
            sel = (epochs == e) & (blocks == b)
            out[sel] = self._order_block(e, b)[pos[sel] - b * ORDER_BLOCK]
        return out

    def _order_block(self, epoch: int, block: int) -> npt.NDArray[np.int64]:
        key = (epoch, block)
        hit = self._blocks.get(key)
        if hit is None:
            start = block * ORDER_BLOCK
            stop = min(start + ORDER_BLOCK, self.num_windows)
            hit = np.asarray(self._epoch_order(epoch)(np.arange(start, stop)), dtype=np.int64)
            self._blocks[key] = hit
            if len(self._blocks) > ORDER_BLOCKS_KEPT:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return hit

    def _doc_index(self, epoch: int) -> DocShuffleIndex:
        """Epoch ``epoch``'s document-shuffle plan, memory-mapped from the plan directory,
        where one process per node builds it while the others wait (a cached plan reads
        no document lengths)."""
        c, root = self.config, self._plan_root()
        key = {"cache": self.cache.fingerprint, "tokens": self.cache.num_tokens,
               "seed": c.seed, "epoch": epoch, "seq_len": c.seq_len, "drop_last": c.drop_last,
               "doc_shuffle_version": DOC_SHUFFLE_VERSION}
        return load_or_build(root, key, lambda: self._reader.all_doc_lengths(root),
                             seed=c.seed, epoch=epoch, seq_len=c.seq_len,
                             drop_last=c.drop_last)

    def _plan_root(self) -> Path:
        if self._plan_dir is not None:
            return self._plan_dir
        return reader_dir(self.cache.root)

    # -- examples -------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, npt.NDArray[Any]]:
        batch = self.get_batch([int(index)])
        return {k: (v[0] if k not in ROW_FREE else v) for k, v in batch.items()}

    def __getitems__(self, indices: list[int] | npt.NDArray[np.integer]) -> Rows:
        """A micro-batch as torch's protocol wants it: a list of per-example dicts (row
        views), which also carries the stacked arrays (``.batch``) for shardwise's
        ``collate``. So ``DataLoader(ds, batch_size=8)`` and HF's collators work."""
        return Rows(self.get_batch(indices))

    def get_batch(self, indices: list[int] | npt.NDArray[np.integer]
                  ) -> dict[str, npt.NDArray[Any]]:
        """A whole micro-batch as a dict of stacked arrays (one call, one allocation each).
        ``indices`` are positions of the global order (past ``len`` in later epochs), shifted
        by :meth:`set_epoch`'s epoch (:mod:`shardwise.read.epochs`)."""
        idx = list(self.positions(indices.tolist() if isinstance(indices, np.ndarray)
                                  else indices))
        if self.config.shuffle is Shuffle.DOCUMENT:
            return self._reader.from_doc_runs(self._doc_runs(idx), len(idx),
                                              self._doc_starts())
        return self._reader.from_windows(self._window_list(idx))

    def _window_list(self, indices: list[int], slot: str = "read") -> list[int]:
        """:meth:`windows` in scalar Python for a micro-batch (a handful of indices: numpy's
        per-call cost would dominate); :data:`PAD` stays ``PAD``. The block last used is
        kept as a list per ``slot``: the reader (``read``) and the look-ahead thread
        (``ahead``, some blocks further on) would otherwise evict each other's, and each
        batch would convert a whole order block to a list twice."""
        n, shuffle = self.num_windows, self.config.shuffle
        (epoch, b), block = self._last_block.get(slot, ((0, 0), []))
        base = epoch * n + b * ORDER_BLOCK
        if indices and min(indices) >= base and max(indices) < base + len(block):
            return [block[i - base] for i in indices]  # a sampler's micro-batch: one block
        out: list[int] = []
        key: tuple[int, int] | None = None
        for i in indices:
            i = int(i)
            if i < 0:
                if i != PAD:
                    raise IndexError(f"example indices must be >= 0 (or {PAD} for padding), "
                                     f"got {i}")
                out.append(PAD)
                continue
            epoch, p = divmod(i, n)
            if shuffle is Shuffle.NONE:
                out.append(p)
                continue
            b, j = divmod(p, ORDER_BLOCK)
            if key != (epoch, b):
                key, block = (epoch, b), self._order_block(epoch, b).tolist()
                self._last_block[slot] = key, block
            out.append(block[j])
        return out

    def prefetch(self, indices: list[int]) -> bool:
        """Start downloading the chunks examples ``indices`` will read, in the background
        (a cache on an object store; local chunks are mapped on demand, so a no-op).
        Returns whether the cache wants the coming examples handed over sooner (its
        look-ahead is shorter than the measured latency needs: Cache.prefetch)."""
        if self.cache.store is None:
            return False
        idx = list(indices)
        if self.config.shuffle is Shuffle.DOCUMENT:
            starts, ranges = self._doc_starts(), []
            for run in self._doc_runs(idx):
                src, stops = self._reader.doc_sources(run, starts)
                ranges += [(a, b) for a, b in zip(src, stops, strict=True) if b > a]
        else:
            L, total = self.config.seq_len, self.cache.num_tokens
            ranges = [(w * L, min(w * L + L + 1, total))
                      for w in self._window_list(idx, "ahead") if w >= 0]
        return self.cache.prefetch(self._reader.chunks_of(ranges))

    def _doc_runs(self, indices: list[int]) -> list[DocRun]:
        """A micro-batch as runs of consecutive windows of one epoch's document order (a
        sampler's micro-batch is one run: its span of the shuffled stream is read in one
        go); :data:`PAD` rows are in no run."""
        n, count = self.num_windows, len(indices)
        i0 = int(indices[0]) if count else PAD
        if i0 >= 0 and i0 % n + count <= n and indices == list(range(i0, i0 + count)):
            epoch, w = divmod(i0, n)  # the usual case, checked in one comparison
            return [(self._epoch_order(epoch), 0, w, count)]
        runs: list[list[Any]] = []
        last = PAD - 1
        for r, i in enumerate(indices):
            i = int(i)
            if i < 0:
                if i != PAD:
                    raise IndexError(f"example indices must be >= 0 (or {PAD} for padding), "
                                     f"got {i}")
                last = PAD - 1
            elif i == last + 1 and i % n:  # continues the run, in the same epoch
                runs[-1][3] += 1
                last = i
            else:
                epoch, w = divmod(i, n)
                runs.append([self._epoch_order(epoch), r, w, 1])
                last = i
        return [(index, row, w, k) for index, row, w, k in runs]

    def _doc_starts(self) -> npt.NDArray[np.int64]:
        """Where each stored document starts in the stream, as a plain array (a memory
        map's subclass costs microseconds per fancy index on the read path)."""
        starts = self._reader.plain_doc_starts
        if starts is None:
            starts = np.asarray(self._reader.stored_doc_starts(self._plan_root())
                                ).view(np.ndarray)
            self._reader.plain_doc_starts = starts
        return starts
