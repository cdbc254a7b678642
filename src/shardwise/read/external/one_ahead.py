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

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from shardwise.concurrency.local import ProcessLocal
from shardwise.concurrency.readahead import ReadAhead

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class OneAhead(Generic[K, V]):
    """Holds the item in use and at most one item being prefetched; nothing else.

    ``get(key)`` returns the held item, or takes over the prefetched one, or loads it in the
    calling thread; the previous item is released *before* the new one is loaded, so at
    most two items are alive (``peak_held <= 2``). Errors of a background load surface in
    ``get`` of that key. Meant for one consumer thread. Both items are this process's
    (:class:`~shardwise.concurrency.local.ProcessLocal`): a forked child (a DataLoader
    worker) drops the parent's in-flight load, and a pickled copy carries only its loader;
    either loads its own.
    """

    def __init__(self, load: Callable[[K], V]) -> None:
        self._load = load
        self._here: ProcessLocal[_Items[K, V]] = ProcessLocal(_Items, name="one ahead")
        self.loads = 0
        self.peak_held = 0

    def _counted_load(self, key: K) -> V:
        self.loads += 1
        return self._load(key)

    def held(self) -> list[K]:
        """Keys alive now: the current item and the one being prefetched."""
        h = self._here.get()
        keys = [] if h.current is None else [h.current[0]]
        return keys + ([] if h.pending is None else [h.pending[0]])

    def _note(self) -> None:
        self.peak_held = max(self.peak_held, len(self.held()))

    def get(self, key: K) -> V:
        h = self._here.get()
        if h.current is not None and h.current[0] == key:
            return h.current[1]
        h.current = None
        pending, h.pending = h.pending, None
        if pending is not None and pending[0] != key:
            pending[1].close(None)  # finish and drop it: a jump never leaves a third item
            pending = None
        value = pending[1].get() if pending is not None else self._counted_load(key)
        h.current = (key, value)
        self._note()
        return value

    def prefetch(self, key: K) -> None:
        """Start loading ``key`` in the background unless it is held or a load is running."""
        h = self._here.get()
        if key in self.held() or h.pending is not None:
            return
        h.pending = key, ReadAhead.call(self._counted_load, key, name="shardwise-prefetch")
        self._note()

    def evict(self, key: K) -> None:
        """Release ``key`` if it is the current item (e.g. a chunk read to its end)."""
        h = self._here.get()
        if h.current is not None and h.current[0] == key:
            h.current = None

    def close(self) -> None:
        """Release everything; waits for a running background load to finish."""
        self._here.close()


class _Items(Generic[K, V]):
    """The items of a :class:`OneAhead` in one process."""

    def __init__(self) -> None:
        self.current: tuple[K, V] | None = None
        self.pending: tuple[K, ReadAhead[V]] | None = None

    def close(self) -> None:
        pending, self.pending, self.current = self.pending, None, None
        if pending is not None:
            pending[1].close(None)
