"""``shuffle="document"``: documents permuted before packing (Megatron's order).

Example ``i`` is window ``i mod n`` of epoch ``i // n``'s shuffled stream; its stored
tokens are pieces of the documents the plan puts there
(:class:`~shardwise.plan.doc_shuffle.DocShuffleIndex`, which the layout's documents give:
a reader's, memory-mapped from its plan directory, where one process per node builds
it). ``locate`` finds the pieces of any
number of windows in a dozen whole-array calls (two binary searches for all of them), and
a sampler's micro-batch (consecutive windows) as the pieces of their one span (one binary
search; each stored token read once); the store joins them (``cache.gather``: a few
dozen pieces of a batch as memoryview slices in one copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.plan.doc_shuffle import DocShuffleIndex
from shardwise.read.orders.base import PAD, IntArray, Order, OrderOptions, Runs, check_indices
from shardwise.read.orders.layout import TokenLayout
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
                 doc_starts: IntArray, doc_lengths: IntArray
                 ) -> tuple[list[int], list[int], int]:
    """``k`` consecutive windows from ``w`` as their one span of the shuffled stream
    (found by one binary search, :meth:`~DocShuffleIndex.span_pieces`): the stored start
    and length of each non-empty piece of it, as lists (a few dozen: list operations cost
    less than whole-array calls), and the span's tokens (each window ``L + 1`` of them,
    read as ``Runs(step=seq_len)``: windows share one token; the last may be short)::

        seq_len 4, windows 1, 2: span [4, 13) = a a b b b b c c c (pieces a, b, c)
        window 1 = a a b b b    window 2 = b b c c c"""
    L, n = seq_len, index.total_tokens
    base = w * L
    stop = min(base + k * L + 1, n)
    docs, skip, end = index.span_pieces(base, stop)
    src, length = doc_starts[docs].tolist(), doc_lengths[docs].tolist()
    length[-1] = end  # the last piece: up to end tokens in; the first from skip in
    src[0] += skip
    length[0] -= skip
    if 0 in length:  # empty documents
        src = [a for a, m in zip(src, length, strict=True) if m]
        length = [m for m in length if m]
    return src, length, stop - base


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

    def __init__(self, layout: TokenLayout, *, seed: int = 0,
                 options: OrderOptions | None = None) -> None:
        super().__init__(layout, seed=seed, options=options)

    def fresh(self) -> dict[str, Any]:
        # plans are memory maps: counted by the process's map budget
        # full: [L + 1] * k per k (a whole span's tokens column)
        return {"plans": open_maps.bounded(EPOCHS_KEPT), "starts": None, "lengths": None,
                "full": {}, "zeros": np.zeros(0, dtype=np.int64)}

    # -- the plan ----------------------------------------------------------------------
    def plan(self, epoch: int) -> DocShuffleIndex:
        """Epoch ``epoch``'s document-shuffle plan, as the layout's documents give it
        (a reader's: memory-mapped from its plan directory, built once per node)."""
        plans = self.derived.get()["plans"]
        hit = plans.get(epoch)
        if hit is None:
            hit = self.layout.doc_shuffle(self.seed, epoch)
            plans.put(epoch, hit)
            open_maps.kept(plans, epoch)
        return hit

    def doc_starts(self) -> IntArray:
        """Where each stored document starts in the stream, as a plain array (a memory
        map's subclass costs microseconds per fancy index on the read path)."""
        derived = self.derived.get()
        if derived["starts"] is None:
            derived["starts"] = np.asarray(self.layout.doc_starts()).view(np.ndarray)
        starts: IntArray = derived["starts"]
        return starts

    def _doc_lengths(self) -> IntArray:
        """Each stored document's length (from :meth:`doc_starts`, once per process): a
        span's pieces are whole documents but for its ends."""
        derived = self.derived.get()
        if derived["lengths"] is None:
            derived["lengths"] = np.diff(self.doc_starts())
        lengths: IntArray = derived["lengths"]
        return lengths

    # -- the questions -----------------------------------------------------------------
    def locate(self, indices: npt.ArrayLike) -> Runs:
        """A few consecutive windows of one epoch (a sampler's micro-batch, ``ds[i]``) as
        their one span of the shuffled stream (:func:`_span_pieces`, ``step = L``); other
        windows of one epoch by :func:`_pieces`; several epochs, or padding, per epoch."""
        n, L = self.n, self.layout.seq_len
        batch = indices if isinstance(indices, list) else []
        count = len(batch)
        i0 = int(batch[0]) if count else PAD
        one = None
        step = 0
        if (0 < count <= SMALL and i0 >= 0 and i0 % n + count <= n
                and batch == list(range(i0, i0 + count))):
            return self._span_runs(i0, count)
        if (one := _one_epoch(indices, n)) is not None:  # one epoch, no padding
            _, stored, length, tokens = _pieces(self.plan(one[0]), one[1], L,
                                                self.doc_starts())
        else:
            idx = check_indices(indices)
            stored, length, tokens = self._locate_epochs(idx, *np.divmod(idx, n))
        cum = self.layout.cum_tokens
        if len(cum) == 2:  # one chunk: stored offsets are its offsets
            return Runs(np.zeros_like(stored), stored, length, tokens, step)
        chunk = cum.searchsorted(stored, side="right") - 1
        return Runs(chunk, stored - cum[chunk], length, tokens, step)

    def _span_runs(self, i0: int, count: int) -> Runs:
        """:meth:`locate` of ``count`` consecutive windows from ``i0`` (one epoch): their
        span's pieces (:func:`_span_pieces`), the columns made by one numpy call."""
        n, L = self.n, self.layout.seq_len
        src, length, held = _span_pieces(self.plan(i0 // n), i0 % n, count, L,
                                         self.doc_starts(), self._doc_lengths())
        if held == count * L + 1:  # whole windows: the usual span
            tokens = self._full(count)
        else:  # the stream's short last window
            tokens = np.minimum(L + 1, held - np.arange(count, dtype=np.int64) * L)
        step, m, cum = (L if count > 1 else 0), len(src), self.layout.cum_tokens
        if len(cum) == 2:  # one chunk: stored offsets are its offsets
            cols = np.array(src + length, dtype=np.int64)
            return tuple.__new__(Runs, (self._zeros(m), cols[:m], cols[m:], tokens, step))
        stored, length_ = np.array(src, dtype=np.int64), np.array(length, dtype=np.int64)
        chunk = cum.searchsorted(stored, side="right") - 1
        return Runs(chunk, stored - cum[chunk], length_, tokens, step)

    def _zeros(self, m: int) -> IntArray:
        """``[0] * m`` (one chunk's ``chunk`` column), read-only: a view of one kept
        array, grown as spans need."""
        derived = self.derived.get()
        zeros: IntArray = derived["zeros"]
        if len(zeros) < m:
            zeros = derived["zeros"] = np.zeros(max(m, 2 * len(zeros)), dtype=np.int64)
            zeros.flags.writeable = False
        return zeros[:m]

    def _full(self, k: int) -> IntArray:
        """``[L + 1] * k``, read-only, kept per ``k`` (shared by batches' Runs)."""
        kept = self.derived.get()["full"]
        hit = kept.get(k)
        if hit is None:
            hit = kept[k] = np.full(k, self.layout.seq_len + 1, dtype=np.int64)
            hit.flags.writeable = False
        return hit

    def _locate_epochs(self, idx: IntArray, epochs: IntArray, w: IntArray
                       ) -> tuple[IntArray, IntArray, IntArray]:
        """:meth:`locate`'s pieces for indices of several epochs, or with padding."""
        parts, tokens = [], np.zeros(len(idx), dtype=np.int64)
        real = idx >= 0
        for e in sorted(set(epochs[real].tolist())):
            rows = np.flatnonzero((epochs == e) & real)
            row, stored, length, held = _pieces(self.plan(e), w[rows], self.layout.seq_len,
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
