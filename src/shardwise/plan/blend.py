"""Blending: which source example ``i`` of a mixture comes from, and which of its examples.

Why: a mixture with weights ``w`` should hold, at *every* prefix of the run, each source's
share to within one example — so a short run, or a resumed one, sees the intended mix, and
a small weight never rounds to zero examples. Random sampling by weight drifts by
``sqrt(n)``; Megatron's rule (take the source whose count lags ``w_j * i`` the most) drifts
by up to ~1.8 examples and the variant with ``w_j * (i + 1)`` by up to ~1.2 (both found by
simulation with skewed weights), so neither keeps the one-example promise.

The rule (version 1) is Tijdeman's solution of the *chairman assignment problem*, a greedy
with deadlines that provably keeps ``|count_j(t) - w_j * t| <= 1 - 1/(2k - 2)`` for all
prefixes ``t`` and ``k >= 2`` sources with positive weight: with ``eps = 1/(2k - 2)``, at
slot ``t = i + 1``

* source ``j`` is *eligible* if ``w_j * t - count_j >= eps`` (its next example is due soon);
* among eligible sources pick the smallest deadline ``(count_j + 1 - eps) / w_j`` (ties: the
  lowest index). An eligible source always exists because the lags sum to 1.

Source ``j``'s first example comes at slot ``<= (1 - eps) / w_j``, i.e. within
``ceil(1 / w_j)`` examples. Worked example, ``w = [0.5, 0.3, 0.2]`` (``eps = 1/4``)::

    i        0 1 2 3 4 5 6 7 8 9
    source   0 1 0 2 0 1 0 2 1 0        counts after 10: 5, 3, 2
    offset   0 0 1 0 2 1 3 1 2 4        (the example's index within its source)

The rule has no closed form, so the schedule is computed sequentially (~1 µs per example)
from the counts at a checkpoint; ``BlendSchedule`` keeps the counts every
``CHECKPOINT_EVERY`` examples, so once a prefix was computed any later seek costs at most one
block. For a run of ``n`` examples, materialise ``blend_index(n, w)`` once and cache it as
``.npy`` when start-up time matters.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from shardwise.plan._checks import IndexLike, IntArray, as_index_array, check_int

BLEND_VERSION: int = 1
"""Recorded in checkpoints; bump whenever the schedule for the same weights changes."""

CHECKPOINT_EVERY = 65536
_KEEP_BLOCKS = 8


def normalize_weights(weights: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Weights divided by their (exactly rounded) sum; refuse what cannot be a mixture."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-d sequence, got shape {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"weights must be finite and >= 0, got {w.tolist()}; "
                         f"give a weight of 0 to leave a source out")
    total = math.fsum(w.tolist())
    if total <= 0:
        raise ValueError(f"at least one weight must be > 0, got {w.tolist()}")
    return np.asarray([x / total for x in w.tolist()], dtype=np.float64)


def _schedule(w: list[float], counts: list[int], t0: int, steps: int) -> list[int]:
    """Sources of slots ``t0+1 .. t0+steps`` given ``counts`` after ``t0``; updates counts."""
    active = [j for j, x in enumerate(w) if x > 0]
    if len(active) == 1:
        counts[active[0]] += steps
        return [active[0]] * steps
    eps = 1.0 / (2 * len(active) - 2)

    def release(j: int) -> int:  # first slot t with w_j * t - count_j >= eps
        t = max(1, math.ceil((counts[j] + eps) / w[j]))
        while t > 1 and w[j] * (t - 1) - counts[j] >= eps:
            t -= 1
        while w[j] * t - counts[j] < eps:
            t += 1
        return t

    pending = [(release(j), j) for j in active]
    heapq.heapify(pending)
    ready: list[tuple[float, int]] = []
    out = []
    for t in range(t0 + 1, t0 + steps + 1):
        while pending and pending[0][0] <= t:
            j = heapq.heappop(pending)[1]
            heapq.heappush(ready, ((counts[j] + 1 - eps) / w[j], j))
        j = heapq.heappop(ready)[1] if ready else heapq.heappop(pending)[1]  # float guard
        out.append(j)
        counts[j] += 1
        heapq.heappush(pending, (release(j), j))
    return out


def _offsets(sources: IntArray, start_counts: IntArray) -> IntArray:
    """Each example's index within its source: the source's count before it."""
    offsets = np.empty_like(sources)
    for j in range(start_counts.size):
        sel = sources == j
        offsets[sel] = start_counts[j] + np.arange(int(sel.sum()), dtype=np.int64)
    return offsets


class BlendSchedule:
    """The blend of fixed ``weights``, with lazily computed checkpoints.

    State (a cache, never part of a checkpoint): the counts at every computed multiple of
    ``CHECKPOINT_EVERY`` and the last few computed blocks.
    """

    def __init__(self, weights: npt.ArrayLike) -> None:
        self.weights = normalize_weights(weights)
        self._w = self.weights.tolist()
        self._counts: list[IntArray] = [np.zeros(self.weights.size, dtype=np.int64)]
        self._blocks: OrderedDict[int, IntArray] = OrderedDict()

    def _block(self, b: int, need: int = CHECKPOINT_EVERY) -> IntArray:
        """Sources of examples ``b*C ..`` (``C = CHECKPOINT_EVERY``), at least ``need`` of them.

        Blocks are computed only as far as asked and extended later; a block that reaches
        ``C`` examples adds the checkpoint of block ``b + 1``.
        """
        while len(self._counts) <= b:  # checkpoints up to block b
            self._block(len(self._counts) - 1)
        have = self._blocks.pop(b, np.zeros(0, np.int64))
        if have.size < need:
            counts = (self._counts[b] + np.bincount(have, minlength=len(self._w))).tolist()
            more = _schedule(self._w, counts, b * CHECKPOINT_EVERY + have.size,
                             need - have.size)
            have = np.concatenate([have, np.asarray(more, dtype=np.int64)])
            if have.size == CHECKPOINT_EVERY and len(self._counts) == b + 1:
                self._counts.append(np.asarray(counts, dtype=np.int64))
        self._blocks[b] = have
        if len(self._blocks) > _KEEP_BLOCKS:
            self._blocks.popitem(last=False)
        return have

    def counts_at(self, t: int) -> IntArray:
        """Examples taken from each source among the first ``t``."""
        b, r = divmod(check_int(t, "t", minimum=0), CHECKPOINT_EVERY)
        head = self._block(b, r)[:r]
        return self._counts[b] + np.bincount(head, minlength=self.weights.size)

    def slice(self, start: int, stop: int) -> tuple[IntArray, IntArray]:
        """``(source_ids, source_offsets)`` of examples ``[start, stop)``."""
        lo = check_int(start, "start", minimum=0)
        hi = check_int(stop, "stop", minimum=lo)
        if hi == lo:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        first, last = lo // CHECKPOINT_EVERY, (hi - 1) // CHECKPOINT_EVERY
        parts = [self._block(b, min(CHECKPOINT_EVERY, hi - b * CHECKPOINT_EVERY))
                 for b in range(first, last + 1)]
        src = np.concatenate(parts)[lo - first * CHECKPOINT_EVERY: hi - first * CHECKPOINT_EVERY]
        return src, _offsets(src, self.counts_at(lo))

    def __call__(self, idx: IndexLike) -> tuple[IntArray, IntArray]:
        """``(source_ids, source_offsets)`` for arbitrary example indices (any shape)."""
        arr, _ = as_index_array(idx, "blend example index")
        if arr.size and arr.min() < 0:
            raise ValueError(f"blend example indices must be >= 0, got {arr.min()}")
        flat = arr.reshape(-1)
        src, off = np.empty_like(flat), np.empty_like(flat)
        for b in np.unique(flat // CHECKPOINT_EVERY).tolist():
            sel = flat // CHECKPOINT_EVERY == b
            s, o = self.slice(b * CHECKPOINT_EVERY, (b + 1) * CHECKPOINT_EVERY)
            src[sel], off[sel] = s[flat[sel] % CHECKPOINT_EVERY], o[flat[sel] % CHECKPOINT_EVERY]
        return src.reshape(arr.shape), off.reshape(arr.shape)


def blend_index(n: int, weights: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    """``(source_ids, source_offsets)`` of the first ``n`` examples of the blend."""
    return BlendSchedule(weights).slice(0, check_int(n, "n", minimum=0))


def blend_slice(start: int, stop: int, weights: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    """Examples ``[start, stop)`` only; equal to ``blend_index(stop, w)[k][start:]``.

    Costs O(stop) the first time; keep a ``BlendSchedule`` to reuse its checkpoints.
    """
    return BlendSchedule(weights).slice(start, stop)
