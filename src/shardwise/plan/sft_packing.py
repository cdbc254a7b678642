"""Packing SFT records into ``seq_len`` bins: first-fit decreasing inside a group.

Why: SFT records are short and vary in length; padding each to ``seq_len`` wastes most of
a batch. Packing several records into one row (with per-record positions and
``cu_seqlens`` for variable-length attention, so records never attend to each other) fills
rows to ~95+%. Packing a whole dataset at once would need every length up front and make
the plan depend on data far away; packing inside *groups* of ``group_size`` consecutive
records keeps memory bounded and makes the plan of group ``g`` a pure function of that
group's lengths — so a consumer's position is just ``(group, bin)`` and resuming costs
one group, whatever the size of the data. (A *window*, in shardwise, is ``seq_len``
tokens; these groups were called packing windows before.)

How (version 1), for the lengths of one group:

1. Records of length 0 are dropped (nothing to train on); records longer than ``seq_len``
   are refused, truncated to ``seq_len``, or dropped (:class:`Overlong`). Both are listed.
2. The rest are taken by length, longest first; equal lengths by index (a stable sort).
3. Each goes into the first bin, in the order the bins were opened, that still has room;
   if none has, it opens a new bin (first-fit decreasing: at most 11/9·OPT + 6/9 bins).
4. With a ``seed``, the bins are then put in a keyed random order
   (:class:`~shardwise.plan.permutation.Permutation` keyed by ``seed`` and the group
   index), so a run does not see each group's longest records first.

Worked example, ``seq_len = 8``, lengths ``[3, 6, 2, 5, 2]`` (no seed)::

    by length     1:6  3:5  0:3  2:2  4:2
    record 1  ->  bin 0 [6]
    record 3  ->  bin 1 [5]          (6 + 5 > 8)
    record 0  ->  bin 1 [5, 3]       (bin 0: 6 + 3 > 8)
    record 2  ->  bin 0 [6, 2]
    record 4  ->  bin 2 [2]
    bins         [[1, 2], [3, 0], [4]]
    cu_seqlens   [0, 6, 8]  [0, 5, 8]  [0, 2]
    position_ids [0 1 2 3 4 5 0 1]  [0 1 2 3 4 0 1 2]  [0 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardwise.choice import Choice
from shardwise.plan._checks import IntArray, check_int
from shardwise.plan.permutation import Permutation

SFT_PACKING_VERSION: int = 1
"""Recorded in checkpoints; bump whenever the plan for the same lengths changes."""


class Overlong(Choice):
    """What to do with a record longer than ``seq_len``."""

    __option__ = "overlong"

    ERROR = "error"
    TRUNCATE = "truncate"
    DROP = "drop"



@dataclass(frozen=True)
class PackPlan:
    """The bins of one group. Record indices are group-local.

    ``order`` holds the placed records bin after bin (each bin's records in the order
    they were placed); bin ``b`` is ``order[bin_starts[b]:bin_starts[b + 1]]`` and
    ``lengths`` (aligned with ``order``) the tokens each takes (after truncation).
    """

    seq_len: int
    order: IntArray
    bin_starts: IntArray
    lengths: IntArray
    dropped: IntArray
    truncated: IntArray

    @property
    def num_bins(self) -> int:
        return len(self.bin_starts) - 1

    @property
    def bins(self) -> list[list[int]]:
        return [self.bin(b).tolist() for b in range(self.num_bins)]

    def _span(self, b: int) -> slice:
        check_int(b, "bin", minimum=0, maximum=self.num_bins - 1)
        return slice(int(self.bin_starts[b]), int(self.bin_starts[b + 1]))

    def bin(self, b: int) -> IntArray:
        """Group-local indices of the records in bin ``b``, in packing order."""
        return self.order[self._span(b)]

    def bin_lengths(self, b: int) -> IntArray:
        return self.lengths[self._span(b)]

    def cu_seqlens(self, b: int) -> npt.NDArray[np.int32]:
        """``[0, l0, l0 + l1, ..., used]`` for bin ``b`` (int32, as flash-attention takes)."""
        return np.concatenate([[0], np.cumsum(self.bin_lengths(b))]).astype(np.int32)

    def position_ids(self, b: int) -> IntArray:
        """Per-token positions of bin ``b``, restarting at 0 at each record."""
        lengths = self.bin_lengths(b)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) - starts


def _first_fit_decreasing(lengths: IntArray, seq_len: int) -> tuple[IntArray, IntArray]:
    """``(order, bin_of_each_in_order)``: FFD over positive lengths ``<= seq_len``."""
    order = np.argsort(-lengths, kind="stable")
    room = np.empty(len(lengths), dtype=np.int64)
    bins = np.empty(len(lengths), dtype=np.int64)
    open_bins = 0
    for k, r in enumerate(order.tolist()):
        need = int(lengths[r])
        fits = room[:open_bins] >= need
        b = int(fits.argmax()) if open_bins and fits.any() else open_bins
        if b == open_bins:
            room[b] = seq_len
            open_bins += 1
        room[b] -= need
        bins[k] = b
    return order.astype(np.int64), bins


def pack_group(lengths: npt.ArrayLike, seq_len: int, *, seed: int | None = None,
               group_index: int = 0, overlong: str | Overlong = Overlong.ERROR) -> PackPlan:
    """First-fit-decreasing bins of ``seq_len`` tokens for one group's record lengths.

    A pure function of its arguments; ``seed`` (with ``group_index``) only orders the
    bins. ``overlong="error"`` raises ``ValueError`` naming the first record that cannot fit.
    """
    n = np.asarray(lengths, dtype=np.int64).reshape(-1)
    L = check_int(seq_len, "seq_len", minimum=1)
    if n.size and n.min() < 0:
        raise ValueError(f"record lengths must be >= 0, got {int(n.min())}")
    mode = Overlong.parse(overlong)
    over = np.flatnonzero(n > L)
    if over.size and mode is Overlong.ERROR:
        raise ValueError(f"record {int(over[0])} of the group has {int(n[over[0]])} tokens, "
                         f"more than seq_len={L} ({over.size} such records); cap them when "
                         "processing (max_length) or pass overlong='truncate' or 'drop'")
    drop = n == 0
    if mode is Overlong.DROP:
        drop |= n > L
    keep = np.flatnonzero(~drop)
    clipped = np.minimum(n[keep], L)
    order, bin_of = _first_fit_decreasing(clipped, L)
    by_bin = np.argsort(bin_of, kind="stable")  # group by bin, keep placement order
    placed = keep[order[by_bin]]
    counts = np.bincount(bin_of, minlength=int(bin_of.max()) + 1 if bin_of.size else 0)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    plan = PackPlan(L, placed, starts, clipped[order[by_bin]], np.flatnonzero(drop),
                    over if mode is Overlong.TRUNCATE else np.zeros(0, np.int64))
    if seed is None or plan.num_bins < 2:
        return plan
    return _shuffle_bins(plan, seed, group_index)


def _shuffle_bins(plan: PackPlan, seed: int, group_index: int) -> PackPlan:
    """The same bins in the order of a keyed permutation of ``(seed, group_index)``."""
    perm = Permutation(plan.num_bins, check_int(seed, "seed", minimum=0),
                       check_int(group_index, "group_index", minimum=0))
    new_to_old = perm(np.arange(plan.num_bins, dtype=np.int64))
    sizes = np.diff(plan.bin_starts)[new_to_old]
    take = np.concatenate([np.arange(plan.bin_starts[b], plan.bin_starts[b + 1])
                           for b in new_to_old.tolist()]).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return PackPlan(plan.seq_len, plan.order[take], starts, plan.lengths[take], plan.dropped,
                    plan.truncated)


def num_pack_groups(n: int, group_size: int) -> int:
    """Groups of ``group_size`` consecutive records covering ``n`` records (the last may
    be short)."""
    return -(-check_int(n, "n", minimum=0) // check_int(group_size, "group_size", minimum=1))


def group_range(g: int, group_size: int, n: int) -> tuple[int, int]:
    """``[start, stop)`` of the records of group ``g``."""
    start = (check_int(g, "group index", minimum=0)
             * check_int(group_size, "group_size", minimum=1))
    return min(start, n), min(start + group_size, n)


__all__ = ["SFT_PACKING_VERSION", "Overlong", "PackPlan", "group_range", "num_pack_groups",
           "pack_group"]
