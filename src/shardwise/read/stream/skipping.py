"""Skip ranges under stream placement: the rules of the global placement, for a rank that
reads its own streams ahead.

A skip list is half-open ranges of *positions* of the global order
(:mod:`shardwise.plan.skips`), whole steps of ``batch_size × R`` (``R`` ranks; a single
example per step without ``batch_size``), normalised by
:func:`~shardwise.read.sampler.normalise_skip`. Rank ``r`` serves global ``j·R + r`` as its
``j``-th example, so with range ends multiples of ``R`` a range ``[a, b)`` is the same
examples ``[a/R, b/R)`` of *every* rank: each rank jumps them alone, and the ranks stay in
step. Example (``R = 2``, skip ``((4, 8),)``)::

    global        0 1 2 3 | 4 5 6 7 | 8 9 …
    rank 0   j    0   1   | 2   3   | 4   …      serves j = 0 1 4 5 …  (global 0 2 8 …)
    rank 1   j      0   1 |   2   3 |   4 …      serves j = 0 1 4 5 …  (global 1 3 9 …)

A rank's read-ahead (one :class:`~shardwise.read.stream.run.Run`) stops scheduling at the
start of the next range (:func:`run_span`): nothing of a skipped range is read. When the
consumer reaches it, a new run starts at the range's end, from the per-stream positions a
resume would compute for that position. ``consumed`` stays a position of the unskipped
order: after ``n`` examples per rank it is the position after the ``n·R``-th served one
(:func:`~shardwise.plan.skips.advance` with step 1: the ranks' served examples interleave
into one run of the global order, a range just makes it jump), so the state, its
fingerprinted skip list and the rule for changing it on resume are the global
placement's (:meth:`shardwise.checkpoint.LoaderState.check_matches`), and
``shardwise trace`` names a skipped stream step as skipped.
"""

from __future__ import annotations

from shardwise.plan.skips import Skip


def rank_ranges(skip: Skip, world_size: int) -> Skip:
    """``skip`` (positions, multiples of ``world_size``) as ranges of every rank's own
    examples: ``rank_ranges(((4, 8),), 2) == ((2, 4),)``."""
    return tuple((a // world_size, b // world_size) for a, b in skip)


def run_span(ranges: Skip, j: int) -> tuple[int, int | None]:
    """From a rank's example ``j`` (``ranges``: :func:`rank_ranges`, sorted and merged):
    the first example it serves (``j``, or the end of the range holding it) and where the
    next range starts (``None``: no range after it), the span one read-ahead covers::

        run_span(((2, 4), (6, 8)), 0) == (0, 2)     run_span(((2, 4), (6, 8)), 3) == (4, 6)
    """
    for a, b in ranges:
        if b <= j:
            continue
        if a <= j:
            j = b
            continue
        return j, a
    return j, None
