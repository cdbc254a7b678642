"""Hold the item in use and load the next one in the background: the memory rule of the
readers over external files (a contiguous shard, a producer chunk).

Why its own module: both :class:`~shardwise.read.external.contiguous.ContiguousShards` and
:class:`~shardwise.read.external.producer_dir.ProducerDirDataset` read one large item at a
time (a shard, a chunk) and want the next one ready when the current one runs out, never
a third in memory. The thread is the one read-ahead thread
(:class:`~shardwise.concurrency.readahead.ReadAhead`); this class adds only the
"current plus one" bookkeeping.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from shardwise.concurrency.readahead import ReadAhead

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class OneAhead(Generic[K, V]):
    """Holds the item in use and at most one item being prefetched; nothing else.

    ``get(key)`` returns the held item, or takes over the prefetched one, or loads it in the
    calling thread; the previous item is released *before* the new one is loaded, so at
    most two items are alive (``peak_held <= 2``). Errors of a background load surface in
    ``get`` of that key. Meant for one consumer thread; after ``fork`` (DataLoader
    workers) a child drops the parent's in-flight load and starts its own.
    """

    def __init__(self, load: Callable[[K], V]) -> None:
        self._load = load
        self._pid = os.getpid()
        self._current: tuple[K, V] | None = None
        self._pending: tuple[K, ReadAhead[V]] | None = None
        self.loads = 0
        self.peak_held = 0

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._pid, self._pending = os.getpid(), None

    def _counted_load(self, key: K) -> V:
        self.loads += 1
        return self._load(key)

    def held(self) -> list[K]:
        """Keys alive now: the current item and the one being prefetched."""
        self._check_fork()
        keys = [] if self._current is None else [self._current[0]]
        return keys + ([] if self._pending is None else [self._pending[0]])

    def _note(self) -> None:
        self.peak_held = max(self.peak_held, len(self.held()))

    def get(self, key: K) -> V:
        self._check_fork()
        if self._current is not None and self._current[0] == key:
            return self._current[1]
        self._current = None
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] != key:
            pending[1].close(None)  # finish and drop it: a jump never leaves a third item
            pending = None
        value = pending[1].get() if pending is not None else self._counted_load(key)
        self._current = (key, value)
        self._note()
        return value

    def prefetch(self, key: K) -> None:
        """Start loading ``key`` in the background unless it is held or a load is running."""
        self._check_fork()
        if key in self.held() or self._pending is not None:
            return
        self._pending = key, ReadAhead.call(self._counted_load, key,
                                            name="shardwise-prefetch")
        self._note()

    def evict(self, key: K) -> None:
        """Release ``key`` if it is the current item (e.g. a chunk read to its end)."""
        if self._current is not None and self._current[0] == key:
            self._current = None

    def __getstate__(self) -> dict[str, Any]:
        """A pickled copy (a DataLoader worker's dataset) keeps only its loader: no
        thread, no item; the copy loads its own."""
        return {"load": self._load}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["load"])  # type: ignore[misc]

    def close(self) -> None:
        """Release everything; waits for a running background load to finish."""
        self._check_fork()
        pending, self._pending, self._current = self._pending, None, None
        if pending is not None:
            pending[1].close(None)



__all__ = ["OneAhead"]
