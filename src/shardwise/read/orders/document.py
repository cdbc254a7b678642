"""``shuffle="document"``: documents permuted before packing (Megatron's order).

Example ``i`` is window ``i mod n`` of epoch ``i // n``'s shuffled stream; its stored
tokens are pieces of the documents the plan puts there
(:class:`~shardwise.plan.doc_shuffle.DocShuffleIndex`, memory-mapped from the plan
directory, where one process per node builds it). ``locate`` finds the pieces of any
number of windows in a dozen whole-array calls (two binary searches for all of them), and
a sampler's micro-batch (consecutive windows) as the pieces of their one span (one binary
search; each stored token read once); the store joins them (``cache.gather``: a few dozen
pieces of a batch as memoryview slices in one copy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.bounded import Bounded
from shardwise.format.paths import reader_dir
from shardwise.plan.doc_shuffle import DOC_SHUFFLE_VERSION, DocShuffleIndex
from shardwise.read.orders.base import PAD, IntArray, Order, Runs, check_indices
from shardwise.read.tokens.plans import (
    doc_lengths_from_starts,
    load_or_build,
    starts_path,
    stored_doc_starts,
)
from shardwise.storage import open_maps
from shardwise.storage.runs import SMALL

EPOCHS_KEPT = 4


def _pieces(index: DocShuffleIndex, w: IntArray, seq_len: int, doc_starts: IntArray,
            rows: bool = False) -> tuple[IntArray | None, IntArray, IntArray, IntArray]:
    """Windows ``w`` of one epoch as pieces of stored documents: (row of ``w`` if
    ``rows``, stored stream start, length) of each non-empty piece, in order, and each
    window's tokens.

    Window ``r`` is shuffled-stream tokens ``[start, stop)``: the documents ``first`` to
    ``last`` holding them, whole but for the first (from ``start``) and the last (to
    ``stop``). One binary search for both ends of every window, then a fixed dozen
    whole-array calls: a random batch costs their overhead, not a Python step per row."""
    cum, order = index._plain
    k = len(w)
    start = w * seq_len
    stop = np.minimum(start + (seq_len + 1), int(cum[-1]))
    ends = cum.searchsorted(np.concatenate((start, stop - 1)), side="right")
    first = ends[:k] - 1
    count = ends[k:] - first
    edge = np.cumsum(count)  # each window's pieces end here
    p = np.arange(int(edge[-1])) + np.repeat(first - edge + count, count)
    at = cum[p]
    lo, hi = at.copy(), cum[p + 1]
    lo[edge - count], hi[edge - 1] = start, stop  # the first and last piece: clipped
    length = hi - lo
    stored = doc_starts[order[p]] + (lo - at)
    row = np.repeat(np.arange(k), count) if rows else None
    keep = length > 0  # not empty documents
    if keep.all():
        return row, stored, length, stop - start
    return None if row is None else row[keep], stored[keep], length[keep], stop - start


def _span_pieces(index: DocShuffleIndex, w: int, k: int, seq_len: int,
                 doc_starts: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """``k`` consecutive windows from ``w`` as their one span of the shuffled stream
    (found by one binary search, :meth:`~DocShuffleIndex.span_pieces`): the stored start
    and length of each non-empty piece of it, and each window's tokens (read as
    ``Runs(step=seq_len)``: windows share one token)::

        seq_len 4, windows 1, 2: span [4, 13) = a a b b b b c c c (pieces a, b, c)
        window 1 = a a b b b    window 2 = b b c c c"""
    L, n = seq_len, index.total_tokens
    base = w * L
    stop = min(base + k * L + 1, n)
    docs, skip, end = index.span_pieces(base, stop)
    src = doc_starts[docs]
    length = doc_starts[docs + 1] - src
    length[-1] = end  # the last piece: up to end tokens in; the first from skip in
    src[0] += skip
    length[0] -= skip
    tokens = np.minimum(L + 1, stop - (w + np.arange(k, dtype=np.int64)) * L)
    keep = length > 0  # not empty documents
    if keep.all():
        return src, length, tokens
    return src[keep], length[keep], tokens


def _one_epoch(indices: npt.ArrayLike, n: int) -> tuple[int, IntArray] | None:
    """``(epoch, windows)`` of indices that are all in one epoch (none padding), else
    None; the bounds of a list are checked in Python (cheaper than numpy for a batch)."""
    if isinstance(indices, list):
        if not indices:
            return None
        lo, hi = min(indices), max(indices)
    else:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not indices.size:
            return None
        lo, hi = int(indices.min()), int(indices.max())
    epoch = lo // n
    if lo < 0 or hi // n != epoch:
        return None
    return epoch, np.asarray(indices, dtype=np.int64) - epoch * n


class DocumentShuffle(Order):
    """Windows of each epoch's document-shuffled stream."""

    name = "document"

    def __init__(self, ds: Any) -> None:
        super().__init__(ds)
        self._plans: Bounded[int, DocShuffleIndex]
        self._starts: IntArray | None
        self._mapped_starts: IntArray | None
        self.__dict__.update(self.fresh())

    def fresh(self) -> dict[str, Any]:
        # plans are memory maps: counted by the process's map budget
        return {"_plans": open_maps.bounded(EPOCHS_KEPT), "_starts": None,
                "_mapped_starts": None}

    # -- the plan ----------------------------------------------------------------------
    def plan(self, epoch: int) -> DocShuffleIndex:
        """Epoch ``epoch``'s document-shuffle plan, memory-mapped from the plan directory,
        where one process per node builds it while the others wait (a cached plan reads
        no document lengths)."""
        hit = self._plans.get(epoch)
        if hit is None:
            ds, root = self.ds, self.plan_root()
            c = ds.config
            key = {"cache": ds.cache.fingerprint, "tokens": ds.cache.num_tokens,
                   "seed": c.seed, "epoch": epoch, "seq_len": c.seq_len,
                   "drop_last": c.drop_last, "doc_shuffle_version": DOC_SHUFFLE_VERSION}
            hit = load_or_build(root, key, lambda: self._all_doc_lengths(root),
                                seed=c.seed, epoch=epoch, seq_len=c.seq_len,
                                drop_last=c.drop_last)
            self._plans.put(epoch, hit)
            open_maps.kept(self._plans, epoch)
        return hit

    def plan_root(self) -> Path:
        plan_dir = self.ds._plan_dir
        return plan_dir if plan_dir is not None else reader_dir(self.ds.cache.root)

    def _stored_doc_starts(self, plan_root: Path) -> IntArray:
        """Start of every document in the stored stream (n_docs + 1 entries), memory-mapped
        from the plan directory, where one process per node builds it (:mod:`.plans`)."""
        if self._mapped_starts is None:
            self._mapped_starts = stored_doc_starts(self.ds.cache, plan_root)
        return self._mapped_starts

    def _all_doc_lengths(self, plan_root: Path) -> npt.NDArray[np.integer]:
        """Every stored document's length (int32 while they fit), from the node's
        document-starts file: only a plan's builder needs it."""
        self._stored_doc_starts(plan_root)
        cache = self.ds.cache
        return doc_lengths_from_starts(starts_path(cache, plan_root), cache.num_documents)

    def doc_starts(self) -> IntArray:
        """Where each stored document starts in the stream, as a plain array (a memory
        map's subclass costs microseconds per fancy index on the read path)."""
        if self._starts is None:
            mapped = self._stored_doc_starts(self.plan_root())
            self._starts = np.asarray(mapped).view(np.ndarray)
        return self._starts

    # -- the questions -----------------------------------------------------------------
    def locate(self, indices: npt.ArrayLike) -> Runs:
        """A few consecutive windows of one epoch (a sampler's micro-batch, ``ds[i]``) as
        their one span of the shuffled stream (:func:`_span_pieces`, ``step = L``); other
        windows of one epoch by :func:`_pieces`; several epochs, or padding, per epoch."""
        n, L, cache = self.ds.num_windows, self.ds.config.seq_len, self.ds.cache
        batch = indices if isinstance(indices, list) else []
        count = len(batch)
        i0 = int(batch[0]) if count else PAD
        one = None
        step = 0
        if (0 < count <= SMALL and i0 >= 0 and i0 % n + count <= n
                and batch == list(range(i0, i0 + count))):
            stored, length, tokens = _span_pieces(self.plan(i0 // n), i0 % n, count, L,
                                                  self.doc_starts())
            step = L if count > 1 else 0
        elif (one := _one_epoch(indices, n)) is not None:  # one epoch, no padding
            _, stored, length, tokens = _pieces(self.plan(one[0]), one[1], L,
                                                self.doc_starts())
        else:
            idx = check_indices(indices)
            stored, length, tokens = self._locate_epochs(idx, *np.divmod(idx, n))
        cum = cache.cum_tokens
        if len(cum) == 2:  # one chunk: stored offsets are its offsets
            return Runs(np.zeros_like(stored), stored, length, tokens, step)
        chunk = cum.searchsorted(stored, side="right") - 1
        return Runs(chunk, stored - cum[chunk], length, tokens, step)

    def _locate_epochs(self, idx: IntArray, epochs: IntArray, w: IntArray
                       ) -> tuple[IntArray, IntArray, IntArray]:
        """:meth:`locate`'s pieces for indices of several epochs, or with padding."""
        parts, tokens = [], np.zeros(len(idx), dtype=np.int64)
        real = idx >= 0
        for e in sorted(set(epochs[real].tolist())):
            rows = np.flatnonzero((epochs == e) & real)
            row, stored, length, held = _pieces(self.plan(e), w[rows], self.ds.config.seq_len,
                                                self.doc_starts(), rows=True)
            assert row is not None  # for mypy: asked for
            parts.append((rows[row], stored, length))
            tokens[rows] = held
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, tokens
        row, stored, length = (np.concatenate(c) for c in zip(*parts, strict=True))
        by = np.argsort(row, kind="stable")  # pieces back in example order
        return stored[by], length[by], tokens


__all__ = ["DocumentShuffle"]
