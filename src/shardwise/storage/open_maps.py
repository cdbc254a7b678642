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

The limit is a quarter of the process's soft ``RLIMIT_NOFILE`` (the rest is the
program's), at most 1024: 256 maps at the usual 1024.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any


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
# (id of a cache's map dict, key) -> weak reference to that dict
_kept: OrderedDict[tuple[int, Any], weakref.ref[OrderedDict[Any, Any]]] = OrderedDict()


def kept(maps: OrderedDict[Any, Any], key: Any) -> None:
    """``maps[key]`` was just mapped: count it, and drop the oldest map of any cache in
    the process while more than :data:`LIMIT` are kept."""
    with _lock:
        _kept[(id(maps), key)] = weakref.ref(maps)
        _kept.move_to_end((id(maps), key))
        while len(_kept) > LIMIT:
            (_, old), ref = _kept.popitem(last=False)
            owner = ref()
            if owner is not None:
                owner.pop(old, None)


def count() -> int:
    """Entries kept (some may belong to caches already gone)."""
    with _lock:
        return len(_kept)


__all__ = ["LIMIT", "count", "kept"]
