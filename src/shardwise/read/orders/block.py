"""``shuffle="block"``: blocks of consecutive windows permuted, then windows inside
groups of blocks (:class:`~shardwise.plan.block_shuffle.BlockShuffle`: read locality).
Its options (:class:`BlockOptions`) are its own: only a block order's state holds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError
from shardwise.plan.block_shuffle import BlockShuffle
from shardwise.read.orders.base import IntArray, OrderOptions
from shardwise.read.orders.windows import WindowOrder

EPOCHS_KEPT = 4


@dataclass(frozen=True)
class BlockOptions(OrderOptions):
    """``block_size`` consecutive windows move together; ``blocks_per_group`` blocks are
    mixed window by window (a reader holds about one group's chunks at a time)."""

    block_size: int = 64
    blocks_per_group: int = 8

    def __post_init__(self) -> None:
        for name in ("block_size", "blocks_per_group"):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=1,
                                                    error=ConfigError))


class BlockOrder(WindowOrder):
    """Windows in the order of ``BlockShuffle(n, seed, epoch, block_size,
    blocks_per_group)``."""

    name = "block"
    Options = BlockOptions
    options: BlockOptions

    def fresh(self) -> dict[str, Any]:
        return {**super().fresh(), "shuffles": {}}

    def window_block(self, epoch: int, positions: IntArray) -> IntArray:
        shuffles: dict[int, BlockShuffle] = self.derived.get()["shuffles"]
        hit = shuffles.get(epoch)
        if hit is None:
            if len(shuffles) >= EPOCHS_KEPT:
                shuffles.pop(next(iter(shuffles)))
            o = self.options
            hit = shuffles[epoch] = BlockShuffle(self.n, self.seed, epoch, o.block_size,
                                                 o.blocks_per_group)
        return hit(positions)


__all__ = ["BlockOptions", "BlockOrder"]
