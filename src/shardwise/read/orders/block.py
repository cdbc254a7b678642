"""``shuffle="block"``: blocks of consecutive windows permuted, then windows inside
groups of blocks (:class:`~shardwise.plan.block_shuffle.BlockShuffle`: read locality)."""

from __future__ import annotations

from typing import Any

from shardwise.plan.block_shuffle import BlockShuffle
from shardwise.read.orders.base import IntArray
from shardwise.read.orders.windows import WindowOrder

EPOCHS_KEPT = 4


class BlockOrder(WindowOrder):
    """Windows in the order of ``BlockShuffle(n, seed, epoch, block_size,
    blocks_per_group)``."""

    name = "block"

    def fresh(self) -> dict[str, Any]:
        return {**super().fresh(), "_shuffles": {}}

    def window_block(self, epoch: int, positions: IntArray) -> IntArray:
        shuffles: dict[int, BlockShuffle] = self.__dict__["_shuffles"]
        hit = shuffles.get(epoch)
        if hit is None:
            if len(shuffles) >= EPOCHS_KEPT:
                shuffles.pop(next(iter(shuffles)))
            c = self.ds.config
            hit = shuffles[epoch] = BlockShuffle(self.n, c.seed, epoch, c.block_size,
                                                 c.blocks_per_group)
        return hit(positions)


__all__ = ["BlockOrder"]
