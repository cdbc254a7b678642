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
walk over steps.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from typing import Any

from shardwise.errors import ConfigError

Skip = tuple[tuple[int, int], ...]


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or getattr(value, "ndim", 0) != 0:
        raise ConfigError(f"{where} must be an integer position, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{where} must be an integer position, got {value!r} "
                          f"({type(value).__name__})") from None


def normalise_skip(ranges: Iterable[Any] | None, step: int, *, unit: str = "examples") -> Skip:
    """``ranges`` sorted and merged (overlapping or touching ranges become one), each
    checked: two integers ``start < stop``, both multiples of ``step`` (a skip leaves out
    whole steps of ``micro_batch_size × world size``, so every rank skips the same step)::

        normalise_skip([(8, 12), (0, 4), (4, 6)], 2) == ((0, 6), (8, 12))
    """
    out: list[tuple[int, int]] = []
    for r in ranges or ():
        if isinstance(r, (str, bytes)) or not hasattr(r, "__len__") or len(r) != 2:
            raise ConfigError(f"skip: each range is a pair (start, stop) of {unit}, got {r!r}")
        start = _as_int(r[0], f"skip range {tuple(r)!r}: start")
        stop = _as_int(r[1], f"skip range {tuple(r)!r}: stop")
        if not 0 <= start < stop:
            raise ConfigError(f"skip range ({start}, {stop}) of {unit} is empty or negative: "
                              "a range is half-open [start, stop) with 0 <= start < stop")
        if start % step or stop % step:
            lo, hi = start - start % step, -(-stop // step) * step
            raise ConfigError(f"skip range ({start}, {stop}) of {unit} is not a whole number "
                              f"of steps of micro_batch_size × world size = {step}: every "
                              f"rank must skip the same steps; use ({lo}, {hi}) to cover it")
        out.append((start, stop))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(out):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return tuple(merged)


def skip_from_steps(steps: Iterable[Any] | None, global_batch_size: int) -> Skip:
    """Global-step ranges ``[a, b)`` → position ranges ``[a·B, b·B)`` (not yet
    normalised): a step ``s`` is positions ``[s·B, (s+1)·B)``."""
    out = []
    for r in steps or ():
        if isinstance(r, (str, bytes)) or not hasattr(r, "__len__") or len(r) != 2:
            raise ConfigError(f"skip_steps: each range is a pair (first step, stop step), "
                              f"got {r!r}")
        a = _as_int(r[0], f"skip_steps range {tuple(r)!r}: start")
        b = _as_int(r[1], f"skip_steps range {tuple(r)!r}: stop")
        if not 0 <= a < b:
            raise ConfigError(f"skip_steps range ({a}, {b}) is empty or negative: a range "
                              "is half-open [start, stop) of global steps, 0 <= start < stop")
        out.append((a * global_batch_size, b * global_batch_size))
    return tuple(out)


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
