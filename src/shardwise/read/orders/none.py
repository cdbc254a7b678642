"""``shuffle="none"``: the stored order, every epoch alike (window ``i mod n``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.read.orders.base import IntArray
from shardwise.read.orders.windows import WindowOrder


class StoredOrder(WindowOrder):
    """Windows in stored order."""

    name = "none"

    def window_block(self, epoch: int, positions: IntArray) -> IntArray:
        return positions

    def window_at(self, epoch: int, position: int) -> int:
        return position

    def _window_list(self, indices: list[int], slot: str, derived: dict[str, Any]
                     ) -> list[int]:
        n = self.n
        if indices and min(indices) < 0:
            return [self._window_of(int(i)) for i in indices]
        return [int(i) % n for i in indices]

    def windows(self, indices: npt.ArrayLike) -> IntArray:
        return np.asarray(indices, dtype=np.int64) % self.n


__all__ = ["StoredOrder"]
