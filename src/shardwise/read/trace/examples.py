"""Where one example of a reader's global order comes from, as token runs of a cache.

Each function answers for one example position in O(1)-ish (a keyed permutation, a
binary search, one block's window order), with the reader's own planning functions —
never a replay of the examples before it:

* TokenDataset (global placement): its order's ``locate(i)`` gives the runs of stored
  tokens (:mod:`shardwise.read.orders`), whatever the order.
* Blend: ``Blend.locate(i)`` → (source, offset), then the source's own answer.
* StreamDataset: example ``i`` is example ``i // R*`` of stream ``i % R*``; the stream's
  layout (:class:`~shardwise.read.stream.schedule.StreamLayout`) gives its block and the
  block's window order, the block's chunks in read order give the tokens.
* PackedSFT: row ``p`` is bin ``b`` of packing group ``w`` of epoch ``e``; the rows per
  group are counted once per group from the packing plans (record lengths only).

A *run* is ``(cache_key, stored_start, stored_stop)``: tokens of the stored stream of
one cache; pieces and lines follow from :class:`~shardwise.read.trace.lines.Documents`.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from shardwise.plan.stream import block_read_order, global_to_stream, window_order
from shardwise.read.stream.schedule import StreamLayout, longest_stream_windows

Run = tuple[int, int, int]  # (offset in the example, stored start, stored stop)


def token_runs(ds: Any, i: int) -> list[Run]:
    """Example ``i`` of a TokenDataset as runs of its cache's stored stream: its order's
    ``locate`` (:mod:`shardwise.read.orders`), whatever the order."""
    runs = ds.locate([i])
    cum = ds.cache.cum_tokens
    out, at = [], 0
    for c, o, n in zip(runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist(),
                       strict=True):
        s = int(cum[c]) + o
        out.append((at, s, s + n))
        at += n
    return out


class StreamExamples:
    """Examples of a StreamDataset's global order (any rank's) as runs."""

    def __init__(self, ds: Any) -> None:
        self.ds, self.cfg = ds, ds.config
        self._layouts: dict[int, StreamLayout] = {}
        self._pad_to: int | None = None
        if self.cfg.epochs is not None:
            self._pad_to = self.cfg.epochs * longest_stream_windows(ds.cache.cum_tokens,
                                                                    self.cfg)

    def layout(self, s: int) -> StreamLayout:
        sl = self._layouts.get(s)
        if sl is None:
            sl = self._layouts[s] = StreamLayout(s, self.cfg)
            sl.update(self.ds.cache)
        return sl

    def runs(self, i: int) -> list[Run] | str:
        """Runs of global example ``i``, or ``"pad"`` / ``"end"`` / ``"unpublished"``."""
        cfg, cache = self.cfg, self.ds.cache
        s, k = global_to_stream(i, cfg.streams)
        sl = self.layout(s)
        where = sl.locate(k, self._pad_to)
        if where is None:
            return "unpublished"
        if isinstance(where, str):
            return where
        epoch, b, r = where
        n = int(sl.cum[b + 1] - sl.cum[b])
        w = int(window_order(s, b, n, seed=cfg.seed, epoch=epoch)[r - int(sl.cum[b])])
        chunks = block_read_order(s, b, sl.block_size(b), n_streams=cfg.streams,
                                  block_chunks=cfg.block_chunks, seed=cfg.seed,
                                  epoch=epoch).tolist()
        cum = cache.cum_tokens
        sizes = [int(cum[c + 1] - cum[c]) for c in chunks]
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        start = w * cfg.seq_len
        stop = min(start + cfg.seq_len + 1, bounds[-1])
        out, pos = [], start
        while pos < stop:
            j = bisect_right(bounds, pos) - 1
            hi = min(stop, bounds[j + 1])
            base = int(cum[chunks[j]]) - bounds[j]
            out.append((pos - start, base + pos, base + hi))
            pos = hi
        return out


class SftRows:
    """Rows of a PackedSFT as record runs: the rows per packing group are counted once
    (record lengths and the packing plan), so row ``p`` costs a search plus one group's
    plan."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self._t0 = 0  # the counts start at group t0 (t = epoch · groups + w) ...
        self._cum = [0]  # ... and _cum[i] rows come before group t0 + i

    def anchor(self, consumed: int, epoch: int, window: int, bin_: int) -> None:
        """Start counting at a PackedSFT state's position (row ``consumed`` is bin
        ``bin_`` of packing group ``window`` (the state's key) of ``epoch``): rows from
        there cost no earlier plan."""
        self._t0, self._cum = epoch * self.ds.num_groups + window, [consumed - bin_]

    def locate(self, p: int) -> tuple[int, int, int] | None:
        """``(epoch, group, bin)`` of row ``p``; ``None`` past the end of the run."""
        ds, nw = self.ds, self.ds.num_groups
        if p < self._cum[0]:  # before the anchor: count from the start
            self._t0, self._cum = 0, [0]
        while self._cum[-1] <= p:
            t = self._t0 + len(self._cum) - 1
            if ds.epochs is not None and t >= ds.epochs * nw:
                return None
            plan, _ = ds.plan(*divmod(t, nw))
            self._cum.append(self._cum[-1] + plan.num_bins)
        i = bisect_right(self._cum, p) - 1
        e, w = divmod(self._t0 + i, nw)
        return e, w, p - self._cum[i]

    def records(self, p: int) -> list[tuple[int, int, int]] | None:
        """``(record index, offset in row, tokens)`` of row ``p``'s records."""
        where = self.locate(p)
        if where is None:
            return None
        e, w, b = where
        plan, _ = self.ds.plan(e, w)
        positions = self.ds._positions(e, w)
        out, at = [], 0
        for r, n in zip(plan.bin(b).tolist(), plan.bin_lengths(b).tolist(), strict=True):
            out.append((int(positions[r]), at, int(n)))
            at += int(n)
        return out
