"""The data-parallel world a reader serves: explicit, never read behind your back.

Readers take a :class:`World`; only :meth:`World.detect` looks at torch.distributed or the
environment. A dataset may be created before the layout is known and bound later with
``.bind(world)``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from shardwise.errors import ConfigError


@dataclass(frozen=True)
class World:
    """Rank ``rank`` of ``size`` data-parallel readers (tensor/pipeline ranks of one
    data-parallel replica share a rank here)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ConfigError(f"world size must be a positive integer, got {self.size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.size:
            raise ConfigError(f"rank must be in [0, {self.size}), got {self.rank!r}")

    @classmethod
    def detect(cls) -> World:
        """torch.distributed when initialized, else ``RANK``/``WORLD_SIZE``, else 0 of 1."""
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), size=dist.get_world_size())
        rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank is not None and size is not None:
            try:
                return cls(rank=int(rank), size=int(size))
            except ValueError:
                raise ConfigError(f"RANK={rank!r} / WORLD_SIZE={size!r} are not integers"
                                  ) from None
        return cls()
