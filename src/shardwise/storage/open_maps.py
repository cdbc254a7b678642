"""One process-wide budget of memory-mapped chunk files, shared by every open cache.

Why: a memory map holds a file descriptor for as long as it lives (CPython's ``mmap``
keeps a duplicate of the file's), and each :class:`~shardwise.storage.cache.Cache` keeps
its most recent chunks mapped (``.bin`` and ``.idx``, up to ``MAX_OPEN_CHUNKS`` each). A
process that opens many caches (a blend of many sources, readers made again every eval)
would hold thousands of descriptors and fail with "Too many open files" (EMFILE) at the
common soft limit of 1024. So every map a cache keeps is also entered here, oldest first;
past :data:`LIMIT` the oldest is dropped from its cache, which maps it again when it
needs it (a stat and an mmap). Arrays already handed out keep their own map alive: a
dropped entry never invalidates data in use.

A store keeps each chunk's map together with the views it reads it by (one
:class:`~shardwise.storage.runs.Mapped` entry, dropped together), so no view outlives its
map's place here; readers hold none. A cache made by :func:`bounded` tells the budget when
it evicts an entry itself (:func:`forget`), so :func:`count` is what is held. Each store's
own bound is its ``max_open_chunks``; this budget caps every store of the process together.

The limit is a quarter of the process's soft ``RLIMIT_NOFILE`` (the rest is the
program's), at most 1024: 256 maps at the usual 1024.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

from shardwise.concurrency.bounded import Bounded


def _limit() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 4096
    except (ImportError, OSError, ValueError):  # not POSIX: the usual default
        soft = 1024
    return max(16, min(1024, soft // 4))


LIMIT = _limit()
_lock = threading.Lock()
# (id of a cache of maps, key) -> weak reference to that cache
_kept: OrderedDict[tuple[int, Any], weakref.ref[Bounded[Any, Any]]] = OrderedDict()


def bounded(items: int) -> Bounded[Any, Any]:
    """A cache of at most ``items`` maps (or views of maps) whose own evictions the
    budget forgets; enter each value put in it with :func:`kept`."""
    return Bounded(items, on_evict=forget)


def forget(maps: Bounded[Any, Any], key: Any, _value: Any = None) -> None:
    """``maps`` dropped ``key`` itself: stop counting it (a :class:`Bounded` hook)."""
    with _lock:
        _kept.pop((id(maps), key), None)


def kept(maps: Bounded[Any, Any], key: Any) -> None:
    """``maps[key]`` (a map, or a view of one) was just kept: count it, and drop the
    oldest map of any cache in the process while more than :data:`LIMIT` are kept."""
    with _lock:
        _kept[(id(maps), key)] = weakref.ref(maps)
        _kept.move_to_end((id(maps), key))
        while len(_kept) > LIMIT:
            (_, old), ref = _kept.popitem(last=False)
            owner = ref()
            if owner is not None:
                owner.pop(old, None)


def counted(maps: Bounded[Any, Any], key: Any) -> bool:
    """Whether ``maps[key]`` is counted by the budget."""
    with _lock:
        return (id(maps), key) in _kept


def count() -> int:
    """Entries kept (some may belong to caches already gone)."""
    with _lock:
        return len(_kept)


__all__ = ["LIMIT", "bounded", "count", "counted", "forget", "kept"]
