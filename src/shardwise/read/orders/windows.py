"""Orders of packed windows: example ``i`` is window ``order_e(i mod n)`` of epoch
``e = i // n``, and window ``w`` is stored tokens ``[w·L, w·L + L + 1)``.

A window order says only which window each position of an epoch holds
(:meth:`WindowOrder.window_block`, vectorised); the rest is here once: the window's
runs of stored tokens (:func:`window_runs`, split at chunk edges), the batches, and a
bounded cache of order blocks (``ORDER_BLOCK`` consecutive positions each) so that

* a sampler's micro-batch (consecutive positions) costs a list lookup per example, its
  block computed once (~0.3 us a window) and converted to a list once;
* random positions cost a lookup each once their blocks are cached: an epoch of up to
  ``CACHE_WINDOWS`` windows is cached whole as it is touched (int32: 4 bytes a window),
  so random access runs at the speed of consecutive access; a longer epoch is computed
  per position (:meth:`WindowOrder.window_at`) where a batch touches a block only
  sparsely.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.bounded import Bounded
from shardwise.plan.windows import window_span
from shardwise.read.orders.base import PAD, IntArray, Order, OrderOptions, Runs, check_indices
from shardwise.read.orders.layout import TokenLayout
from shardwise.storage.runs import SMALL

ORDER_BLOCK = 4096
CACHE_WINDOWS = 1 << 21
_MIN_KEPT = 8 * ORDER_BLOCK


def window_runs(windows: IntArray, seq_len: int, total: int, cum: IntArray) -> Runs:
    """Windows (``PAD``: none) as runs of stored tokens, split at chunk edges (``cum``:
    the chunks' token prefix sums, total last); a short last window is clipped. Every
    run holds at least one token. The one place a window's tokens are computed.

    Every window whole inside one chunk (the usual batch): one run each, in a few
    whole-array calls; else split where chunks end."""
    L, k = seq_len, len(windows)
    if k and windows.min() >= 0:
        start = windows * L
        if len(cum) == 2:  # one chunk: stored offsets are its offsets
            if int(start.max()) + L + 1 <= total:
                full = np.full(k, L + 1, dtype=np.int64)
                return Runs(np.zeros(k, dtype=np.int64), start, full, full)
        else:
            first = cum.searchsorted(start, side="right") - 1
            if (start + (L + 1) <= cum[first + 1]).all():
                full = np.full(k, L + 1, dtype=np.int64)
                return Runs(first, start - cum[first], full, full)
    real = windows >= 0
    start, stop = window_span(np.where(real, windows, 0), seq_len, total)
    start, stop = np.where(real, start, 0), np.where(real, stop, 0)
    first = np.searchsorted(cum, start, side="right") - 1
    last = np.maximum(np.searchsorted(cum, np.maximum(stop - 1, start), side="right") - 1,
                      first)
    pieces = last - first + 1
    row = np.repeat(np.arange(len(windows)), pieces)
    chunk = first[row] + np.arange(len(row)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    lo = np.maximum(cum[chunk], start[row])
    length = np.minimum(cum[chunk + 1], stop[row]) - lo
    keep = length > 0  # padding, and empty chunks a window spans
    return Runs(chunk[keep], (lo - cum[chunk])[keep], length[keep], stop - start)


class WindowOrder(Order):
    """Base of the window orders; subclasses define :meth:`window_block`."""

    def __init__(self, layout: TokenLayout, *, seed: int = 0,
                 options: OrderOptions | None = None) -> None:
        super().__init__(layout, seed=seed, options=options)

    def fresh(self) -> dict[str, Any]:
        # blocks: the cache of order blocks; lists: the block last used as a list, per
        # caller (the reader, and a look-ahead thread some blocks further on, would
        # otherwise evict each other's); cum: the chunks' token prefix sums as a list;
        # full: [0] * n and [L + 1] * n, per n
        return {"blocks": Bounded(weight=max(CACHE_WINDOWS, _MIN_KEPT), weigh=len),
                "lists": {}, "cum": (-1, []), "full": {}}

    def window_block(self, epoch: int, positions: IntArray) -> IntArray:
        """The windows at ``positions`` (consecutive, inside one epoch) of ``epoch``."""
        raise NotImplementedError

    def window_at(self, epoch: int, position: int) -> int:
        """The window at one position (a faster scalar form may override it)."""
        return int(self.window_block(epoch, np.asarray([position], dtype=np.int64))[0])

    # -- the cache of order blocks -------------------------------------------------------
    def _block(self, epoch: int, b: int) -> npt.NDArray[np.integer]:
        key = (epoch, b)
        blocks = self.derived.get()["blocks"]
        hit = blocks.get(key)
        if hit is not None:
            return hit
        start = b * ORDER_BLOCK
        pos = np.arange(start, min(start + ORDER_BLOCK, self.n), dtype=np.int64)
        hit = np.asarray(self.window_block(epoch, pos))
        hit = hit.astype(np.int32 if self.n < 2**31 else np.int64)
        return blocks.put(key, hit)

    def _window_of(self, i: int, blocks: Bounded | None = None) -> int:
        """One example's window (:data:`PAD` stays ``PAD``): from its cached block, else
        its block computed when the epoch fits the cache, else computed alone
        (``blocks``: :attr:`derived`'s, where the caller has it)."""
        if i < 0:
            if i != PAD:
                raise IndexError(f"example indices must be >= 0 (or {PAD} for padding), "
                                 f"got {i}")
            return PAD
        epoch, p = divmod(i, self.n)
        b, j = divmod(p, ORDER_BLOCK)
        hit = (self.derived.get()["blocks"] if blocks is None else blocks).get((epoch, b))
        if hit is None:
            if self.n > CACHE_WINDOWS:
                return self.window_at(epoch, p)
            hit = self._block(epoch, b)
        return int(hit[j])

    # -- the questions -----------------------------------------------------------------
    def window_list(self, indices: list[int], slot: str = "read") -> list[int]:
        """Windows of a micro-batch as a list. Dense positions inside one block (a
        sampler's batch) read that block's list; others look each up
        (:meth:`_window_of`)."""
        return self._window_list(indices, slot, self.derived.get())

    def _window_list(self, indices: list[int], slot: str, derived: dict[str, Any]
                     ) -> list[int]:
        """:meth:`window_list` with this process's :attr:`derived` state looked up by the
        caller (once per batch); the method an order with a faster rule overrides."""
        if not indices:
            return []
        lo, hi = min(indices), max(indices)
        if lo >= 0 and len(indices) > 1 and hi - lo < 2 * len(indices):  # dense: a sampler's
            epoch, p = divmod(lo, self.n)
            b = p // ORDER_BLOCK
            base = epoch * self.n + b * ORDER_BLOCK
            if hi < base + ORDER_BLOCK and hi < (epoch + 1) * self.n:
                lists = derived["lists"]
                key, block = lists.get(slot, (-1, []))
                if key != base:
                    block = self._block(epoch, b).tolist()
                    lists[slot] = base, block
                return [block[i - base] for i in indices]
        blocks = derived["blocks"]
        return [self._window_of(int(i), blocks) for i in indices]

    def windows(self, indices: npt.ArrayLike) -> IntArray:
        """Global example indices (``>= 0``) → their windows, vectorised."""
        idx = np.asarray(indices, dtype=np.int64)
        epochs, pos = np.divmod(idx, self.n)
        blocks = pos // ORDER_BLOCK
        out = np.empty_like(pos)
        for e, b in set(zip(epochs.reshape(-1).tolist(), blocks.reshape(-1).tolist(),
                            strict=True)):
            sel = (epochs == e) & (blocks == b)
            out[sel] = self._block(e, b)[pos[sel] - b * ORDER_BLOCK]
        return out

    def _batch_runs(self, windows: list[int], derived: dict[str, Any]) -> Runs | None:
        """:func:`window_runs` of a micro-batch (``windows``, a few) in Python, where list
        operations cost less than the fixed cost of whole-array calls: consecutive windows
        as their one span (``step = L``: each stored token read once), others one run each
        while each lies whole inside one chunk; None for the rest (padding, a window across
        a chunk edge or short). The ``chunk``/``tokens`` columns of one chunk's whole
        windows are shared between batches, read-only. ``derived``: this process's
        :attr:`derived` state, looked up once per batch by the caller."""
        cum = self.layout.cum_tokens
        n_cum, bounds = derived["cum"]
        if n_cum != len(cum):
            n_cum, bounds = derived["cum"] = (len(cum), cum.tolist())
        L, k, w0 = self.layout.seq_len, len(windows), windows[0]
        if k > 1 and w0 >= 0 and windows[-1] == w0 + k - 1 and windows == list(
                range(w0, w0 + k)):
            return self._span(w0, k, bounds, L, derived)
        if n_cum == 2:  # one chunk: stored offsets are its offsets
            if min(windows) < 0 or max(windows) * L + L + 1 > bounds[1]:
                return None
            zeros, full = derived["full"].get(k) or self._columns(k, L, derived)
            starts = np.array([w * L for w in windows], dtype=np.int64)
            return tuple.__new__(Runs, (zeros, starts, full, full, 0))  # C: hot
        chunk, offset = [], []  # one array of both: a numpy call costs more than a slice
        for w in windows:
            start = w * L
            c = bisect_right(bounds, start) - 1
            if w < 0 or start + L + 1 > bounds[c + 1]:
                return None
            chunk.append(c)
            offset.append(start - bounds[c])
        both, full = np.array(chunk + offset, dtype=np.int64), self._columns(k, L, derived)[1]
        return tuple.__new__(Runs, (both[:k], both[k:], full, full, 0))  # C: hot

    def _span(self, w0: int, k: int, bounds: list[int], L: int, derived: dict[str, Any]
              ) -> Runs:
        """Windows ``w0 … w0 + k - 1`` as their span of the stored stream, cut where
        chunks end; the last window of the stream may be short (``drop_last=False``)."""
        total = bounds[-1]
        start, stop = w0 * L, min(w0 * L + k * L + 1, total)
        chunk, offset, length = [], [], []
        c = bisect_right(bounds, start) - 1
        while start < stop:
            end = min(stop, bounds[c + 1])
            if end > start:  # not an empty chunk
                chunk.append(c)
                offset.append(start - bounds[c])
                length.append(end - start)
                start = end
            c += 1
        tokens = self._columns(k, L, derived)[1]
        if stop - w0 * L < k * L + 1:  # the stream's short last window
            tokens = np.minimum(tokens, stop - (w0 + np.arange(k)) * L)
        m = len(chunk)  # one array of the three: a numpy call costs more than a slice
        cols = np.array(chunk + offset + length, dtype=np.int64)
        return tuple.__new__(Runs, (cols[:m], cols[m:2 * m], cols[2 * m:], tokens, L))

    def _columns(self, k: int, L: int, derived: dict[str, Any]
                 ) -> tuple[IntArray, IntArray]:
        """``[0] * k`` and ``[L + 1] * k``, read-only, kept per ``k``."""
        kept = derived["full"]
        hit = kept.get(k)
        if hit is None:
            zeros, full = np.zeros(k, dtype=np.int64), np.full(k, L + 1, dtype=np.int64)
            zeros.flags.writeable = full.flags.writeable = False
            hit = kept[k] = zeros, full
        return hit

    def locate(self, indices: npt.ArrayLike) -> Runs:
        """A list (a micro-batch) by :meth:`window_list`, and its runs in Python while it
        is small (:meth:`_batch_runs`: consecutive windows as one span); an array
        vectorised, per example."""
        if isinstance(indices, list):
            derived = self.derived.get()  # once per batch: a process-local lookup
            windows = self._window_list(indices, "read", derived)
            if 0 < len(windows) <= SMALL:
                hit = self._batch_runs(windows, derived)
                if hit is not None:
                    return hit
            w = np.asarray(windows, dtype=np.int64)
        else:
            idx = check_indices(indices)
            w = np.where(idx >= 0, self.windows(np.maximum(idx, 0)), PAD)
        lay = self.layout
        return window_runs(w, lay.seq_len, lay.total, lay.cum_tokens)


__all__ = ["CACHE_WINDOWS", "ORDER_BLOCK", "WindowOrder", "window_runs"]
