"""Loaded chunks, bounded in bytes: what a stream reader holds in memory.

Why: a stream rank reads whole chunks, sequentially, and serves windows out of them in a
shuffled order; the chunks of the blocks it is consuming must stay in memory, the ones it
has finished with must go, and the total must not grow with the data. Chunks are read
with plain ``read()`` calls into private arrays (never memory-mapped), so the process's
RSS is exactly what this cache holds, and dropping an entry gives the memory back.

Entries in use are *pinned* (``acquire`` … ``release``, counted, so one chunk can serve two
blocks at once) and never evicted; unpinned entries stay cached, least recently used
evicted first, while the total is above ``max_bytes``. A small cache that cycles epochs
thus never re-reads a chunk::

    max_bytes = 4 MB, chunks of 1 MB
    acquire a b c   → [a* b* c*]        3 MB, all pinned (* = pinned)
    release a       → [b* c* a]         a stays cached
    acquire d e     → [b* c* d* e*]     a evicted to stay within 4 MB
    acquire a       → miss: a is read again

Thread-safe: the prefetch thread acquires, the consumer releases.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError, CorruptChunkError
from shardwise.storage.cache import Cache

Tokens = npt.NDArray[np.generic]


@dataclass
class _Entry:
    tokens: Tokens
    pins: int


class ChunkCache:
    """An LRU of chunk token arrays keyed by global chunk index, bounded in bytes.

    State (for ``stats()``): ``bytes`` held, ``pinned_bytes``, ``hits``, ``misses``,
    ``evictions``, ``peak_bytes``; ``loads``: how often each chunk was read.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = as_count(max_bytes, "chunk_cache_bytes", error=ConfigError)
        self.changed = threading.Condition()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self.bytes = self.pinned_bytes = self.peak_bytes = 0
        self.hits = self.misses = self.evictions = 0
        self.loads: Counter[int] = Counter()

    def __contains__(self, chunk: int) -> bool:
        with self.changed:
            return chunk in self._entries

    def acquire(self, chunk: int, load: Callable[[], Tokens]) -> Tokens:
        """Chunk ``chunk``'s tokens, pinned; ``load()`` reads them on a miss (unlocked)."""
        with self.changed:
            hit = self._entries.get(chunk)
            if hit is not None:
                self.hits += 1
                self._pin(hit)
                self._entries.move_to_end(chunk)
                return hit.tokens
        tokens = load()
        with self.changed:
            self.misses += 1
            self.loads[chunk] += 1
            entry = self._entries.get(chunk)
            if entry is None:
                entry = self._entries[chunk] = _Entry(tokens, 0)
                self.bytes += tokens.nbytes
            self._pin(entry)
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            self._evict()
            return entry.tokens

    def release(self, chunk: int) -> None:
        """Unpin one use of ``chunk``; it stays cached until room is needed."""
        with self.changed:
            entry = self._entries.get(chunk)
            if entry is None or entry.pins == 0:  # dropped by clear(): nothing to unpin
                return
            entry.pins -= 1
            if entry.pins == 0:
                self.pinned_bytes -= entry.tokens.nbytes
            self._evict()
            self.changed.notify_all()

    def clear(self) -> None:
        """Drop every entry, pinned or not (the reader is closing)."""
        with self.changed:
            self._entries.clear()
            self.bytes = self.pinned_bytes = 0
            self.changed.notify_all()

    def stats(self) -> dict[str, int]:
        with self.changed:
            return {"bytes": self.bytes, "pinned_bytes": self.pinned_bytes,
                    "peak_bytes": self.peak_bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses, "evictions": self.evictions}

    def _pin(self, entry: _Entry) -> None:
        if entry.pins == 0:
            self.pinned_bytes += entry.tokens.nbytes
        entry.pins += 1

    def _evict(self) -> None:
        if self.bytes <= self.max_bytes:
            return
        for chunk in [c for c, e in self._entries.items() if e.pins == 0]:
            entry = self._entries.pop(chunk)
            self.bytes -= entry.tokens.nbytes
            self.evictions += 1
            if self.bytes <= self.max_bytes:
                return


def read_chunk(cache: Cache, c: int) -> Tokens:
    """Chunk ``c``'s tokens, read (not memory-mapped) into a private array, checked
    against its checksum before use (:meth:`CacheChecks.loaded`)."""
    info = cache.chunks[c]
    out = np.empty(info.tokens, dtype=cache.dtype)

    def fill(path: Path) -> tuple[int, bytes]:
        with open(path, "rb", buffering=0) as f:
            return (f.readinto(out.data.cast("B")) if out.nbytes else 0), f.read(1)

    name = f"{cache.location}/{info.stem}.bin"
    try:  # through the bounded download directory when the cache is on an object store
        got, extra = cache.with_chunk_file(c, ".bin", fill)
    except FileNotFoundError:
        raise CorruptChunkError(f"{name}: named by the ledger but missing; run "
                                f"'shardwise verify {cache.location}'") from None
    if got != out.nbytes or extra:
        raise CorruptChunkError(f"{name}: size differs from the {info.tokens} tokens the "
                                f"ledger records; run 'shardwise verify {cache.location}'")
    cache.checks.loaded(c, out)  # checksum and ids, before any use
    cache.opened[info.stem] += 1
    return out
