"""Where a PackedSFT's rows are: row ``p`` of the global order → its packing group's bin
→ the records in it → their runs of stored tokens (``PackedSFT.locate``, ``trace``).

Rows per packing group are counted once per group from the packing plans (record lengths
only), so row ``p`` costs a binary search plus one group's plan, never a replay of the
rows before it::

    groups of 4, 2, 3 rows: cum [0, 4, 6, 9]   row 5 = group 1, bin 1
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from shardwise.errors import ConfigError
from shardwise.read.orders.base import PAD, IntArray, Runs, check_indices


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


def sft_runs(ds: Any, rows: SftRows, indices: Any) -> Runs:
    """PackedSFT ``ds``'s rows ``indices`` (:data:`PAD`, or past the end of a finite run:
    none) as runs of its records' stored tokens, each record one run, in row order;
    ``tokens``: each row's real tokens (its padding is no stored token)."""
    start_of = getattr(ds.records, "token_start", None)
    if start_of is None:
        raise ConfigError("PackedSFT.locate needs records of a token cache "
                          "(CacheRecords): these records have no stored tokens")
    chunk, offset, length, tokens = [], [], [], []
    for p in check_indices(indices).tolist():
        recs = rows.records(p) if p != PAD else None
        for d, _, n in recs or []:
            c, o = start_of(d)
            chunk.append(c)
            offset.append(o)
            length.append(n)
        tokens.append(sum(n for _, _, n in recs or []))
    def column(values: list[int]) -> IntArray:
        return np.asarray(values, dtype=np.int64)
    return Runs(column(chunk), column(offset), column(length), column(tokens))


__all__ = ["SftRows", "sft_runs"]
