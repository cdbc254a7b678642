"""``shuffle="window"`` (the default): a keyed permutation of all windows per epoch
(:class:`~shardwise.plan.permutation.Permutation`, evaluated per position: nothing per
epoch is materialised beyond the bounded cache of order blocks)."""

from __future__ import annotations

from typing import Any

from shardwise.plan.permutation import Permutation
from shardwise.read.orders.base import IntArray
from shardwise.read.orders.windows import WindowOrder

EPOCHS_KEPT = 4


class WindowShuffle(WindowOrder):
    """Windows in the order of ``Permutation(n, seed, epoch)``."""

    name = "window"

    def fresh(self) -> dict[str, Any]:
        return {**super().fresh(), "perms": {}}

    def _perm(self, epoch: int) -> Permutation:
        perms: dict[int, Permutation] = self.derived.get()["perms"]
        hit = perms.get(epoch)
        if hit is None:
            if len(perms) >= EPOCHS_KEPT:
                perms.pop(next(iter(perms)))
            hit = perms[epoch] = Permutation(self.n, self.seed, epoch)
        return hit

    def window_block(self, epoch: int, positions: IntArray) -> IntArray:
        return self._perm(epoch)(positions)

    def window_at(self, epoch: int, position: int) -> int:
        return self._perm(epoch)(position)  # the scalar walk: ~10x cheaper than an array


__all__ = ["WindowShuffle"]
