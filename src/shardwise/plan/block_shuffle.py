"""Block shuffle: a random order that still reads storage in long runs.

Why: a full permutation of windows sends every example to a random place in the token
stream, i.e. one random read per example. On network or spinning storage, and with a
bounded chunk cache, it is much cheaper to read *blocks* of consecutive windows. The
block shuffle keeps most of the randomness and restores locality:

1. windows are grouped into blocks of ``block_size`` consecutive windows (the last block
   may be short);
2. the order of blocks is permuted by ``Permutation(n_blocks, seed, epoch)``;
3. the permuted block sequence is cut into groups of ``blocks_per_group`` blocks and the
   windows of each group are permuted among themselves by a second keyed permutation
   (``permute_within``, key from ``seed``, ``epoch`` and the group number).

A reader that consumes positions in order touches ``blocks_per_group`` blocks at a time.
Worked example (``BlockShuffle(n=10, seed=0, epoch=0, block_size=3, blocks_per_group=2)``)::

    blocks          B0=[0 1 2]  B1=[3 4 5]  B2=[6 7 8]  B3=[9]      (B3 is short)
    block order     B1 B2 | B3 B0                                   (groups of 2 blocks)
    group windows   [3 4 5 6 7 8] | [9 0 1 2]
    positions 0..9  [5 6 8 4 7 3] | [0 1 9 2]

The group that holds the short block is shorter; position ``i`` finds its group in O(1)
because at most one group before it is short. Degenerate settings mean:
``block_size=1, blocks_per_group=1`` is exactly ``Permutation(n, seed, epoch)`` (full
shuffle); ``blocks_per_group=1`` shuffles block order and windows inside each block;
``block_size >= n`` shuffles inside one block (still a full shuffle of ``range(n)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import overload

import numpy as np
import numpy.typing as npt

from shardwise.plan._checks import (
    IndexLike,
    IntArray,
    as_index_array,
    check_in_range,
    check_int,
    unwrap,
)
from shardwise.plan.permutation import MAX_N, Permutation, permute_within

GROUP_TAG = "block_shuffle.windows"


@dataclass(frozen=True)
class BlockShuffle:
    """Position ``i`` of the epoch -> window index; a bijection of ``range(n)``.

    >>> bs = BlockShuffle(n=10, seed=0, epoch=0, block_size=3, blocks_per_group=2)
    >>> sorted(bs(np.arange(10))) == list(range(10))
    True
    """

    n: int
    seed: int
    epoch: int
    block_size: int
    blocks_per_group: int
    _blocks: Permutation = field(init=False, repr=False, compare=False)
    _short_slot: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.n, "BlockShuffle n", minimum=0, maximum=MAX_N)
        check_int(self.block_size, "block_size", minimum=1)
        check_int(self.blocks_per_group, "blocks_per_group", minimum=1)
        blocks = Permutation(self.n_blocks, seed=self.seed, epoch=self.epoch)
        object.__setattr__(self, "_blocks", blocks)
        object.__setattr__(self, "_short_slot",
                           blocks.inverse(self.n_blocks - 1) if self.n_blocks else 0)

    @property
    def _b(self) -> int:
        """Block size clamped to ``n`` (same output, no int64 overflow in products)."""
        return max(1, min(int(self.block_size), int(self.n)))

    @property
    def n_blocks(self) -> int:
        return -(-int(self.n) // self._b)

    @property
    def _g(self) -> int:
        return max(1, min(int(self.blocks_per_group), self.n_blocks))

    @overload
    def __call__(self, idx: int) -> int: ...
    @overload
    def __call__(self, idx: npt.ArrayLike) -> IntArray: ...

    def __call__(self, idx: IndexLike) -> int | IntArray:
        """The window at position(s) ``idx``; the result has the shape of ``idx``."""
        arr, scalar = as_index_array(idx, "BlockShuffle index")
        check_in_range(arr, self.n, f"BlockShuffle(n={self.n})")
        if arr.size == 0:
            return unwrap(arr.copy(), scalar)
        return unwrap(self._apply(arr.reshape(-1)).reshape(arr.shape), scalar)

    def _apply(self, i: IntArray) -> IntArray:
        b, g, nb = self._b, self._g, self.n_blocks
        short = int(self.n) - (nb - 1) * b        # size of the last block, 1..b
        d = b - short                             # windows missing from the short block
        gs = self._short_slot // g                # group that holds the short block
        grp = i // (g * b)
        grp = np.where(i >= (grp + 1) * g * b - d * (grp >= gs), grp + 1, grp)
        offset = i - (grp * g * b - d * (grp > gs))
        size = np.minimum(g, nb - grp * g) * b - d * (grp == gs)
        o = permute_within(offset, size, grp, seed=self.seed, epoch=self.epoch, tag=GROUP_TAG)
        after_short = (grp == gs) & (o >= (self._short_slot - grp * g) * b + short)
        o = o + d * after_short
        return self._blocks(grp * g + o // b) * b + o % b
