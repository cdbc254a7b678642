"""Skip ranges: leave whole steps of the global order out, keep every position's meaning.

The skip-and-resume recipe after a loss spike: restore a checkpoint from before the spike
and skip the data batches around it. A skip list is a few half-open ranges of
*positions* in the global order (example ``i`` of the order is position ``i``); the
sampler walks the order in steps of ``step = micro_batch_size × world size`` positions and
jumps over a range instead of reading it. Every other position is read exactly as without
skips, so position ``p`` (and global step ``p // B``) names the same examples with or
without a skip list — a step number in a log or in ``shardwise trace`` stays true. A
position counter (a state's ``consumed``) jumps over a skipped range::

    step 2, skip ((4, 8),)   positions  0 1 | 2 3 | 4 5 | 6 7 | 8 9 | …
    served steps                        [0 1] [2 3]  --skipped--  [8 9] …
    consumed after 1, 2, 3 served steps:  2, 4, 10   (4 is just before the jump)

Every function is pure arithmetic over the (sorted, merged) ranges: O(ranges), never a
walk over steps. The ranges are checked and normalised where a reader takes them
(:func:`shardwise.read.sampler.normalise_skip`).
"""

from __future__ import annotations

from collections.abc import Iterator

Skip = tuple[tuple[int, int], ...]


def skipped_in(skip: Skip, lo: int, hi: int | None) -> int:
    """Positions in ``[lo, hi)`` (``hi`` ``None``: to infinity, then only whole ranges
    count) that ``skip`` leaves out."""
    total = 0
    for a, b in skip:
        stop = b if hi is None else min(b, hi)
        total += max(0, stop - max(a, lo))
    return total


def advance(skip: Skip, position: int, k: int, step: int) -> int:
    """The position after serving ``k`` more steps from ``position``: the ranges met on
    the way are jumped, a range starting right after the ``k``-th step is not (yet)."""
    p = position
    for a, b in skip:
        if b <= p:
            continue
        if k == 0:
            return p
        if a <= p:  # p is inside a range: the next step served is its end
            p = b
            continue
        room = (a - p) // step
        if k <= room:
            return p + k * step
        k, p = k - room, b
    return p + k * step


def served_segments(skip: Skip, start: int, end: int | None) -> Iterator[tuple[int, int | None]]:
    """The runs ``[lo, hi)`` of positions in ``[start, end)`` a sampler reads (``hi``
    ``None``: endless)::

        list(served_segments(((4, 8),), 0, 12)) == [(0, 4), (8, 12)]
    """
    p = start
    for a, b in skip:
        if b <= p:
            continue
        if end is not None and a >= end:
            break
        if a > p:
            yield p, a
        p = b
    if end is None or p < end:
        yield p, end
