"""Distributed sampling as index arithmetic: which positions rank ``r`` reads at step ``k``.

Why: a sampler object with an internal cursor is state to checkpoint and to get wrong on
resume. Every answer here is a pure function of ``(k, rank, world_size, micro_batch_size,
consumed, ...)``, so resuming is just passing ``consumed`` again and any rank can compute
any other rank's share (which is how tests simulate many ranks in one process).

Three schemes, named after the Megatron-LM samplers they reproduce (``m`` the micro-batch
size, ``W`` the world size):

* **single** (``MegatronPretrainingSampler``): the global order is read in steps of
  ``m*W``; rank ``r`` takes the ``r``-th run of ``m``. The global order does not depend on
  ``W``: concatenating the ranks' micro-batches in rank order gives it back. ``m=2, W=2``::

      global order   0 1 2 3 | 4 5 6 7 | ...
      step 0         rank0 [0 1]  rank1 [2 3]
      step 1         rank0 [4 5]  rank1 [6 7]

* **cyclic** (``MegatronPretrainingRandomSampler``): reshuffle every epoch. An epoch is
  ``n - n % (m*W)`` examples (the remainder is skipped that epoch, as in Megatron). With
  ``data_sharding`` rank ``r`` owns the contiguous bucket ``[r*B, (r+1)*B)``
  (``B = (n // (m*W)) * m``) and reads it in a per-rank keyed order — each rank touches
  only its slice of the data, but the order depends on ``W``. Without it, epoch ``e`` is
  ``Permutation(n, seed, e)`` read like *single*.
* **eval**: one pass in stored order, every example once; positions past the end are
  ``-1`` (mask them) so all ranks run the same number of steps and nothing is duplicated.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import overload

import numpy as np
import numpy.typing as npt

from shardwise.plan._checks import (
    IndexLike,
    IntArray,
    as_position_array,
    check_int,
    divisors,
)
from shardwise.plan.permutation import Permutation, derive_seed

BUCKET_SEED_TAG = "cyclic_bucket"


def validate_batch_layout(global_batch_size: int, micro_batch_size: int,
                          world_size: int) -> int:
    """Gradient-accumulation steps ``B / (m * W)``; raise unless that is a whole number."""
    gbs = check_int(global_batch_size, "global_batch_size", minimum=1)
    m = check_int(micro_batch_size, "micro_batch_size", minimum=1)
    w = check_int(world_size, "world_size", minimum=1)
    if gbs % (m * w):
        hint = (f"world sizes that work with micro_batch_size={m}: {divisors(gbs // m)}"
                if gbs % m == 0 else f"first make it a multiple of micro_batch_size={m}")
        raise ValueError(f"global_batch_size must be a multiple of micro_batch_size * "
                         f"world_size = {m} * {w} = {m * w}, got {gbs}; {hint}")
    return gbs // (m * w)


def _layout(rank: int, world_size: int, micro_batch_size: int) -> tuple[int, int, int]:
    w = check_int(world_size, "world_size", minimum=1)
    r = check_int(rank, "rank", minimum=0)
    if r >= w:
        raise ValueError(f"rank must be in [0, world_size={w}), got {r}")
    return r, w, check_int(micro_batch_size, "micro_batch_size", minimum=1)


def micro_batch_indices(k: int, *, rank: int, world_size: int, micro_batch_size: int,
                        consumed: int = 0) -> IntArray:
    """*single*: positions in the global order of rank ``rank``'s ``k``-th micro-batch.

    ``consumed`` positions were read before step 0 (resume). Map the positions through the
    epoch's permutation and bound them by the data size in the caller.
    """
    r, w, m = _layout(rank, world_size, micro_batch_size)
    start = (check_int(consumed, "consumed", minimum=0)
             + check_int(k, "k", minimum=0) * m * w + r * m)
    return np.arange(start, start + m, dtype=np.int64)


def iter_micro_batches(*, rank: int, world_size: int, micro_batch_size: int,
                       consumed: int = 0, steps: int | None = None) -> Iterator[list[int]]:
    """*single*: rank ``rank``'s micro-batches ``k = 0, 1, …`` (``steps`` of them, or
    endless) as lists, equal to :func:`micro_batch_indices` for each ``k``. Arguments are
    checked once, not per step: this is what a loader calls every step."""
    r, w, m = _layout(rank, world_size, micro_batch_size)
    start = check_int(consumed, "consumed", minimum=0) + r * m
    ks = itertools.count() if steps is None else range(check_int(steps, "steps", minimum=0))
    for k in ks:
        first = start + k * m * w
        yield list(range(first, first + m))


def num_micro_batches(n: int, *, world_size: int, micro_batch_size: int,
                      consumed: int = 0) -> int:
    """*single*: complete steps (one micro-batch per rank) left in ``n`` positions."""
    _, w, m = _layout(0, world_size, micro_batch_size)
    left = check_int(n, "n", minimum=0) - check_int(consumed, "consumed", minimum=0)
    return max(0, left) // (m * w)


@overload
def epoch_and_offset(consumed: int, n: int) -> tuple[int, int]: ...
@overload
def epoch_and_offset(consumed: npt.ArrayLike, n: int) -> tuple[IntArray, IntArray]: ...


def epoch_and_offset(consumed: IndexLike,
                     n: int) -> tuple[int, int] | tuple[IntArray, IntArray]:
    """Split a count of consumed examples into ``(epoch, position in epoch)``."""
    size = check_int(n, "n (examples per epoch)", minimum=1)
    arr, scalar = as_position_array(consumed, "consumed")
    epoch, offset = np.divmod(arr, size)
    if scalar:
        return int(epoch.reshape(-1)[0]), int(offset.reshape(-1)[0])
    return epoch, offset


def cyclic_micro_batch_indices(k: int, *, n: int, rank: int, world_size: int,
                               micro_batch_size: int, seed: int, consumed: int = 0,
                               data_sharding: bool = True) -> IntArray:
    """*cyclic*: example ids (in ``[0, n)``) of rank ``rank``'s ``k``-th micro-batch.

    ``consumed`` counts examples of all ranks, as Megatron's ``consumed_samples`` does.
    """
    r, w, m = _layout(rank, world_size, micro_batch_size)
    size, mw = check_int(n, "n", minimum=0), m * w
    active = size - size % mw
    if active == 0:
        raise ValueError(f"cyclic sampling needs at least micro_batch_size * world_size = "
                         f"{mw} examples, got n={size}; lower micro_batch_size or world_size")
    done = check_int(consumed, "consumed", minimum=0) + check_int(k, "k", minimum=0) * mw
    if not data_sharding:
        epoch, offset = epoch_and_offset(np.arange(done + r * m, done + (r + 1) * m), active)
        out = np.empty(m, dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = Permutation(size, seed=seed, epoch=int(e))(offset[sel])
        return out
    if done % mw:
        raise ValueError(f"with data_sharding, consumed must be a multiple of "
                         f"micro_batch_size * world_size = {mw}, got {consumed}")
    ep, in_epoch = epoch_and_offset(done, active)
    bucket, first = active // w, in_epoch // w
    order = Permutation(bucket, seed=derive_seed(seed, BUCKET_SEED_TAG, r), epoch=ep)
    return r * bucket + order(np.arange(first, first + m, dtype=np.int64))


def num_eval_steps(n: int, *, world_size: int, micro_batch_size: int) -> int:
    """*eval*: steps (one micro-batch per rank) to see all ``n`` examples, last one padded."""
    _, w, m = _layout(0, world_size, micro_batch_size)
    return -(-check_int(n, "n", minimum=0) // (m * w))


def eval_micro_batch_indices(k: int, *, n: int, rank: int, world_size: int,
                             micro_batch_size: int) -> IntArray:
    """*eval*: rank ``rank``'s ``k``-th micro-batch in stored order; ``-1`` marks padding."""
    r, w, m = _layout(rank, world_size, micro_batch_size)
    steps = num_eval_steps(n, world_size=w, micro_batch_size=m)
    if not 0 <= check_int(k, "k") < steps:
        raise ValueError(f"eval step k must be in [0, {steps}) for n={n}, got {k}")
    pos = micro_batch_indices(k, rank=r, world_size=w, micro_batch_size=m)
    return np.where(pos < n, pos, -1)
