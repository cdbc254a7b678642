"""``set_epoch(epoch)`` on map-style readers: the hook torch's samplers, accelerate, Lightning
and HF call as an epoch starts.

A map-style reader's indices are positions of its global order, which runs on across
epochs: position ``p`` is example ``p mod n`` of epoch ``p // n`` (``n = len(ds)``; a
TokenDataset reshuffles every epoch). shardwise's own loaders walk those positions. A
framework's sampler walks ``[0, n)`` every epoch, so every epoch would repeat epoch 0's
order; ``set_epoch(e)`` makes index ``i`` read position ``e·n + i``::

    n = 4    set_epoch(0): ds[0], …, ds[3] = positions 0..3
             set_epoch(1): ds[0], …, ds[3] = positions 4..7   (epoch 1's shuffled order)

Exact resume: the epoch is part of the position, not of the reader's config (its
fingerprint does not change). A framework that saves its epoch and its sampler's place
and calls ``set_epoch`` again on resume (accelerate's and Lightning's loops do) continues
exactly. Where nothing calls it (your own loop over a DataLoader), call
``ds.set_epoch(epoch)`` as each epoch starts, as with torch's DistributedSampler. With
``persistent_workers=True`` the workers keep the epoch they started with: use
``persistent_workers=False`` (workers are made again, with the new epoch, every epoch).

shardwise's own loaders (``shardwise.torch.loader``, ``shardwise.torchdata.batch_sampler``,
``ShardwiseTrainer``) hand the reader positions of the global order already, so they
refuse a reader whose epoch is not 0 (both shifting would skip whole epochs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError


class EpochView:
    """``set_epoch`` for a map-style reader with ``__len__`` (see the module docs); the
    reader passes the indices it is asked for through :meth:`positions`."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch``: index ``i`` is position ``epoch × len(self) + i``."""
        epoch = as_count(epoch, "epoch", error=ConfigError)
        len(self)  # type: ignore[arg-type]  # a reader without a length has no epochs to set
        self.epoch = epoch

    @overload
    def positions(self, indices: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]: ...
    @overload
    def positions(self, indices: Sequence[int]) -> Sequence[int]: ...
    def positions(self, indices: Any) -> Any:
        """Indices → positions of the global order (``PAD``, -1, stays -1)."""
        if not self.epoch:
            return indices
        shift = self.epoch * len(self)  # type: ignore[arg-type]
        if isinstance(indices, np.ndarray):
            return np.where(indices < 0, indices, indices + shift)
        return [i if i < 0 else i + shift for i in indices]


def refuse_epoch_view(dataset: Any, what: str) -> None:
    """ConfigError if ``dataset`` was moved to another epoch and ``what`` (a shardwise
    loader, which walks positions of the global order itself) is about to read it."""
    epoch = getattr(dataset, "epoch", 0) if isinstance(dataset, EpochView) else 0
    if epoch:
        raise ConfigError(f"{type(dataset).__name__}.set_epoch({epoch}) was called, but "
                          f"{what} walks the global order across epochs itself (its position "
                          f"holds the epoch), so it would read epoch {epoch} on top of its "
                          "own: call set_epoch(0), or leave set_epoch to a plain DataLoader's "
                          "sampler loop")


__all__ = ["EpochView", "refuse_epoch_view"]
