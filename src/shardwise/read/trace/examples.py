"""Where one example of a reader's global order comes from, as token runs of a cache.

Each function answers for one example position in O(1)-ish (a keyed permutation, a
binary search, one block's window order), with the reader's own planning functions —
never a replay of the examples before it:

* TokenDataset (global placement): its order's ``locate(i)`` gives the runs of stored
  tokens (:mod:`shardwise.read.orders`), whatever the order.
* Blend: ``Blend.locate(i)`` → its source, its position there and that source's runs.
* StreamDataset: its order's ``locate(i)`` too (:mod:`shardwise.read.orders.stream`), after
  ``where(i)`` names a padding example, one past the end or one not published yet.
* PackedSFT: row ``p`` is bin ``b`` of packing group ``w`` of epoch ``e``; the rows per
  group are counted once per group from the packing plans (record lengths only).

A *run* is ``(cache_key, stored_start, stored_stop)``: tokens of the stored stream of
one cache; pieces and lines follow from :class:`~shardwise.read.trace.lines.Documents`.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

Run = tuple[int, int, int]  # (offset in the example, stored start, stored stop)


def token_runs(ds: Any, i: int) -> list[Run]:
    """Example ``i`` of a TokenDataset as runs of its cache's stored stream: its order's
    ``locate`` (:mod:`shardwise.read.orders`), whatever the order."""
    return stored_runs(ds.locate([i]), ds.cache.cum_tokens)


def stored_runs(runs: Any, cum: Any) -> list[Run]:
    """One example's :class:`~shardwise.read.orders.Runs` as runs of the stored stream
    (``cum``: its cache's chunk token prefix sums)."""
    out, at = [], 0
    for c, o, n in zip(runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist(),
                       strict=True):
        s = int(cum[c]) + o
        out.append((at, s, s + n))
        at += n
    return out


def stream_runs(ds: Any, i: int) -> list[Run] | str:
    """Example ``i`` of a StreamDataset's global order as runs (its order's ``locate``,
    :mod:`shardwise.read.orders.stream`), or ``"pad"`` / ``"end"`` / ``"unpublished"``."""
    found = ds.order.where(i)
    return found if isinstance(found, str) else token_runs(ds, i)


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
