"""A cache's documents as a sequence of records, for :class:`PackedSFT` (and any reader
of records by index).

Record ``d`` is document ``d`` of the cache in ledger order: ``{"input_ids": ids}`` for a
token cache (a read-only view of the chunk's memory-mapped ``.bin``, in the cache's
dtype, found by the ``.idx``'s pointer: nothing is read until it is used), or the row
of a record cache's Parquet chunk (``input_ids`` and whatever else the processor kept,
e.g. ``labels``). Only the chunk holding a record is opened; record chunks are read whole
and the last few kept.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardwise.concurrency.bounded import Bounded
from shardwise.errors import ConfigError
from shardwise.format.chunk import ChunkKind
from shardwise.storage.cache import Cache
from shardwise.storage.opening import reader_cache

KEEP_CHUNKS = 4


class CacheRecords:
    """``records[d]`` is document ``d`` of the cache; ``len`` is its documents."""

    def __init__(self, cache: Cache | str | os.PathLike[str], *,
                 verify: bool | None = None) -> None:
        self.cache = reader_cache(cache, verify)
        self._tables: Bounded[int, list[dict[str, Any]]] = Bounded(KEEP_CHUNKS)

    @property
    def fingerprint(self) -> str:
        """What a PackedSFT state records about its records: the cache and its size."""
        return f"{self.cache.fingerprint}:{self.cache.num_documents}"

    def __len__(self) -> int:
        return self.cache.num_documents

    def locate(self, d: int) -> tuple[int, int]:
        """``(chunk, document within it)`` of document ``d``."""
        if not 0 <= d < len(self):
            raise IndexError(f"document {d} is outside the cache's {len(self)} documents")
        c = int(np.searchsorted(self.cache.cum_docs, d, side="right")) - 1
        return c, d - int(self.cache.cum_docs[c])

    def token_start(self, d: int) -> tuple[int, int]:
        """``(chunk, token offset in it)`` where document ``d`` of a token cache starts."""
        c, k = self.locate(int(d))
        if self.cache.chunks[c].kind is not ChunkKind.TOKENS:
            raise ConfigError(f"document {d} is a record of a {self.cache.chunks[c].kind.value}"
                              " chunk, not stored tokens")
        idx = self.cache.index(c)
        if idx.num_documents == idx.num_sequences:  # a pointer: O(1)
            return c, int(idx.sequence_pointers[k]) // idx.dtype.itemsize
        return c, int(np.sum(idx.document_lengths[:k], dtype=np.int64))  # several sequences

    def __getitem__(self, d: int) -> dict[str, Any]:
        c, k = self.locate(int(d))
        if self.cache.chunks[c].kind is ChunkKind.TOKENS:
            _, start = self.token_start(d)
            # a view of the memory map: len() (a packing plan) reads no token
            return {"input_ids": self.cache.tokens(c)[start: start + int(
                self.cache.index(c).document_lengths[k])]}
        return self._rows(c)[k]

    def _rows(self, c: int) -> list[dict[str, Any]]:
        hit = self._tables.get(c)
        if hit is None:
            import pyarrow.parquet as pq

            table = self.cache.with_chunk_file(c, ".parquet", pq.read_table)
            hit = self._tables.put(c, table.to_pylist())
        return hit
