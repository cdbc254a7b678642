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
    """The blend of fixed ``weights``, computed lazily from known positions.

    A *known position* is a slot ``t`` with the per-source counts after it: 0, every
    computed multiple of ``CHECKPOINT_EVERY``, and any position given to :meth:`seed`
    (a checkpoint's counts), so a resume costs at most one block, not O(t). The rule's
    next choice depends only on ``(t, counts)``, which is what makes seeding exact.
    State (a cache, never part of a checkpoint): known positions and the last few runs.
    """

    def __init__(self, weights: npt.ArrayLike) -> None:
        self.weights = normalize_weights(weights)
        self._w = self.weights.tolist()
        self._known: dict[int, IntArray] = {0: np.zeros(self.weights.size, dtype=np.int64)}
        self._runs: OrderedDict[int, IntArray] = OrderedDict()

    def seed(self, t: int, counts: npt.ArrayLike) -> None:
        """Declare the counts after ``t`` examples (e.g. saved in a checkpoint). Refuses
        counts that cannot be this blend's (wrong total, or off the weights by > 1)."""
        t = check_int(t, "t", minimum=0)
        c = np.asarray(counts, dtype=np.int64).reshape(-1)
        if (c.size != self.weights.size or int(c.sum()) != t or (c < 0).any()
                or (np.abs(c - self.weights * t) > 1 + 1e-9).any()):
            raise ValueError(f"counts {c.tolist()} cannot follow {t} examples of a blend with "
                             f"weights {self.weights.tolist()}")
        self._known.setdefault(t, c)

    def _start(self, t: int) -> int:
        """The latest known position at or before ``t``."""
        return max(k for k in self._known if k <= t)

    def _run(self, t0: int, stop: int) -> IntArray:
        """Sources of slots ``t0 .. stop`` (``t0`` known, ``stop`` at most the next block
        boundary after ``t0``), extending a cached run if there is one."""
        have = self._runs.pop(t0, np.zeros(0, np.int64))
        if have.size < stop - t0:
            counts = (self._known[t0] + np.bincount(have, minlength=len(self._w))).tolist()
            more = _schedule(self._w, counts, t0 + have.size, stop - t0 - have.size)
            have = np.concatenate([have, np.asarray(more, dtype=np.int64)])
            if stop % CHECKPOINT_EVERY == 0:
                self._known.setdefault(stop, np.asarray(counts, dtype=np.int64))
        self._runs[t0] = have
        if len(self._runs) > _KEEP_BLOCKS:
            self._runs.popitem(last=False)
        return have[: stop - t0]

    def _sources(self, lo: int, hi: int) -> tuple[int, IntArray]:
        """``(t0, sources of [t0, hi))`` for the latest known ``t0 <= lo``."""
        t0 = self._start(lo)
        parts, pos = [], t0
        while pos < hi:
            boundary = (pos // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY
            stop = min(hi, boundary) if pos >= lo - CHECKPOINT_EVERY else boundary
            parts.append(self._run(pos, stop))
            pos = stop
            if pos < lo:  # skipped ahead: only the part from the last boundary is kept
                parts = []
                t0 = pos
        return t0, (np.concatenate(parts) if parts else np.zeros(0, np.int64))

    def counts_at(self, t: int) -> IntArray:
        """Examples taken from each source among the first ``t``."""
        t = check_int(t, "t", minimum=0)
        if t in self._known:
            return self._known[t].copy()
        t0, src = self._sources(t, t)
        return self._known[t0] + np.bincount(src[: t - t0], minlength=self.weights.size)

    def slice(self, start: int, stop: int) -> tuple[IntArray, IntArray]:
        """``(source_ids, source_offsets)`` of examples ``[start, stop)``."""
        lo = check_int(start, "start", minimum=0)
        hi = check_int(stop, "stop", minimum=lo)
        if hi == lo:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        t0, src = self._sources(lo, hi)
        before = self._known[t0] + np.bincount(src[: lo - t0], minlength=self.weights.size)
        mine = src[lo - t0: hi - t0]
        return mine, _offsets(mine, before)

    def __call__(self, idx: IndexLike) -> tuple[IntArray, IntArray]:
        """``(source_ids, source_offsets)`` for arbitrary example indices (any shape)."""
        arr, _ = as_index_array(idx, "blend example index")
        if arr.size and arr.min() < 0:
            raise ValueError(f"blend example indices must be >= 0, got {arr.min()}")
        flat = arr.reshape(-1)
        src, off = np.empty_like(flat), np.empty_like(flat)
        if flat.size:
            lo, hi = int(flat.min()), int(flat.max()) + 1
            if hi - lo <= 4 * CHECKPOINT_EVERY:
                s, o = self.slice(lo, hi)
                return s[flat - lo].reshape(arr.shape), o[flat - lo].reshape(arr.shape)
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
