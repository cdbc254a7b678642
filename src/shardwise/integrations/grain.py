"""Grain: batches read from a shardwise reader in one call each, not one per example.

``grain.MapDataset.source(ds)`` works with any shardwise map-style reader (random access,
``len``), and every one has Grain's batched-read method ``_getitems`` (see
:mod:`shardwise.read.rows`), which Grain's own transformations (shuffle, slice, repeat,
map) pass down to the source. But Grain 0.2's ``MapDataset.batch`` still asks its parent
for one element at a time (its batch push-down is an experiment switched off), so a batch
of 64 is 64 reads. :func:`batch` is ``.batch`` with the push-down on: each batch is ONE
``_getitems`` call through the pipeline, ONE batched read of the reader, and, when the
rows come back untouched (shuffle, slice, repeat), no stacking either::

    import grain
    from shardwise.grain import batch
    ds = grain.MapDataset.source(sw.TokenDataset("cache/", seq_len=2048, seed=1))
    ds = ds.shuffle(seed=1)[rank::world]            # Grain's own order and sharding
    for b in batch(ds, 64, drop_remainder=True): ...  # same batches as ds.batch(64)

The elements are Grain's ``ds.batch(...)``'s, equal value for value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardwise.errors import ConfigError, MissingExtraError
from shardwise.read.rows import Rows

try:
    import grain
except ImportError as e:  # pragma: no cover - exercised only without grain
    raise MissingExtraError("shardwise.grain needs Grain: pip install 'shardwise[grain]'"
                            ) from e


class BatchedRead(grain.MapDataset):  # type: ignore[misc]
    """``parent.batch(batch_size)``, each batch read with one ``parent._getitems`` call.

    Batches do not span epochs (as Grain's): batch ``i`` of epoch ``e`` is elements
    ``[i·B, min((i+1)·B, n))`` of epoch ``e``; ``drop_remainder`` drops a short last one."""

    def __init__(self, parent: Any, batch_size: int, *, drop_remainder: bool = False) -> None:
        super().__init__(parent)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        self._batch_size, self._drop_remainder = batch_size, drop_remainder
        n = len(parent)
        self._length = n // batch_size if drop_remainder else -(-n // batch_size)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        n = len(self._parent)
        epoch, i = divmod(index, self._length)
        start = epoch * n + i * self._batch_size
        stop = epoch * n + min(n, (i + 1) * self._batch_size)
        return stack(self._parent._getitems(list(range(start, stop))))

    def __str__(self) -> str:
        return (f"BatchedRead(batch_size={self._batch_size}, "
                f"drop_remainder={self._drop_remainder})")


def stack(rows: Any) -> Any:
    """Elements → one batch: a shardwise reader's rows are already stacked (``Rows.batch``);
    dicts of arrays are stacked key by key; anything else with ``np.stack``."""
    if isinstance(rows, Rows):
        return dict(rows.batch)
    if any(r is None for r in rows):
        raise ConfigError("a batch met a missing element (a filter's None): batch after "
                          "ds.to_iter_dataset() as Grain's .batch says")
    if rows and isinstance(rows[0], dict):
        return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
    return np.stack([np.asarray(r) for r in rows])


def batch(parent: Any, batch_size: int, *, drop_remainder: bool = False) -> BatchedRead:
    """``parent.batch(batch_size, drop_remainder=...)`` with one batched read per batch."""
    return BatchedRead(parent, batch_size, drop_remainder=drop_remainder)


__all__ = ["BatchedRead", "batch", "stack"]
