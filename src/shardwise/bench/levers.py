"""The ways a cache on an object store reads faster than a whole-chunk reader (the levers
of ``bench remote``), each switched off for ``--ablate`` by the bench alone.

The product has no switch for them: :class:`~shardwise.storage.bucket.BucketStore`
always reads with every lever. To measure one, the bench gives the store it opened a
subclass that reads as before that lever:

==========  =====================================================================
``ranged``  a batch whose chunks are still arriving waits for them, whole (no ranged
            GETs of just its runs; every batch takes the fast path through the maps)
``pace``    the look-ahead's bytes are half of ``local_bytes``, not sized by the
            measured pace less what the reader holds mapped
``group``   one block of a chunk file asked for at a time, not several at once
``native``  GETs through fsspec, not the client without the GIL: the bench makes its
            ``RemoteStore`` with ``client="fsspec"`` (a choice every user has)
==========  =====================================================================
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from shardwise.storage.bucket import BucketStore
from shardwise.storage.prefetch import Prefetcher
from shardwise.storage.store import ChunkStore

LEVERS = ("ranged", "native", "pace", "group")


class _WholeChunks(BucketStore):
    def gather(self, runs: Any) -> npt.NDArray[Any]:
        return ChunkStore.gather(self, runs)

    def prefetch_runs(self, runs: Any) -> bool:
        return ChunkStore.prefetch_runs(self, runs)  # the chunks only, no early reads


class _HalfBudget(BucketStore):
    def _new_prefetcher(self) -> Prefetcher:
        return Prefetcher(self._downloads().max_bytes // 2)


class _OneBlock(BucketStore):
    group = 1


_WITHOUT: dict[str, type[BucketStore]] = {
    "ranged": _WholeChunks, "pace": _HalfBudget, "group": _OneBlock}


def switch_off(store: BucketStore, off: frozenset[str]) -> None:
    """Make ``store`` (just opened, nothing read yet) read without the levers ``off``
    (``native`` is the client its ``RemoteStore`` was made with)."""
    bases = tuple(_WITHOUT[name] for name in sorted(off) if name in _WITHOUT)
    if bases:
        store.__class__ = type(f"BucketStoreWithout_{'_'.join(sorted(off))}", bases, {})


__all__ = ["LEVERS", "switch_off"]
