"""An open cache: the ledger's view of its visible chunks, and the store that holds them
(opened by :mod:`shardwise.storage.opening`).

A :class:`Cache` is a view of the ledger's visible chunks in global order (a
:class:`~shardwise.storage.chunk_table.ChunkTable` of columns), with prefix sums of
documents and tokens, so that planning needs no chunk file, plus one
:class:`~shardwise.storage.store.ChunkStore` (a directory or Megatron prefix,
``LocalStore``; a prefix on an object store read through a node-local copy,
``BucketStore``) that owns everything touching bytes: memory maps, downloads, downloads
ahead, integrity checks. The cache never asks which kind of store it holds.
``opened`` counts the chunks whose token data a process has touched (the locality contract
is tested with it), and ``opened_index`` the chunks whose ``.idx`` (document lengths,
metadata only) it has read. :meth:`Cache.refresh` re-reads the ledger of a cache that is
still being built: the visible chunk list only ever grows.

What a cache checks as it is read (structure on open, ids per batch, checksums once per
node) is described in :mod:`shardwise.storage.integrity`; ``open_cache(..., verify=False)``
trusts the cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from shardwise.errors import CacheError
from shardwise.format.chunk import ChunkMeta
from shardwise.format.journal import LedgerTail
from shardwise.format.ledger import LEDGER_NAME
from shardwise.format.ledger_index import ChunkColumns, SourceTotals
from shardwise.format.manifest import Manifest
from shardwise.format.megatron import MegatronIndex
from shardwise.storage.chunk_table import ChunkInfo, ChunkTable
from shardwise.storage.integrity import CacheChecks
from shardwise.storage.store import ChunkStore

_T = TypeVar("_T")


class Cache:
    """A read-only view of a cache. Create it with
    :func:`~shardwise.storage.opening.open_cache`."""

    def __init__(self, store: ChunkStore, *, manifest: Manifest | None,
                 chunks: ChunkTable | Sequence[ChunkInfo],
                 dtype: np.dtype, eod_id: int | None, vocab_size: int | None,
                 finished: bool, errors: dict[str, int], fingerprint: str,
                 verify: bool = True, sources: Sequence[SourceTotals] = ()) -> None:
        self._view_of(store, manifest=manifest, chunks=chunks, dtype=dtype, eod_id=eod_id,
                      vocab_size=vocab_size, finished=finished, errors=errors,
                      fingerprint=fingerprint, verify=verify, sources=sources)
        store.bind(self)
        self.tail: LedgerTail | None = None  # made by the first refresh
        assert store.checks is not None
        self.checks: CacheChecks = store.checks

    def _view_of(self, store: ChunkStore, *, manifest: Manifest | None,
                 chunks: ChunkTable | Sequence[ChunkInfo], dtype: np.dtype,
                 eod_id: int | None, vocab_size: int | None, finished: bool,
                 errors: dict[str, int], fingerprint: str, verify: bool,
                 sources: Sequence[SourceTotals]) -> None:
        """The ledger's view, without binding ``store`` to it (a document range reads
        through its parent's)."""
        self.store = store
        self.root: Path = store.root  # this node's directory: plans go under it
        self.verify = verify
        self.manifest = manifest
        self.dtype = dtype
        self.eod_id = eod_id
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.finished = finished
        self.errors = errors
        self.sources = list(sources)  # per source, every chunk the ledger names
        self.chunks = (chunks if isinstance(chunks, ChunkTable)
                       else ChunkTable.of(self.root, chunks, where=str(self.root)))
        self.cum_tokens = np.zeros(1, dtype=np.int64)
        self.cum_docs = np.zeros(1, dtype=np.int64)
        self._extend(self.chunks.columns)

    def __repr__(self) -> str:
        state = "finished" if self.finished else "building"
        return (f"Cache({self.location!r}, chunks={len(self.chunks)}, "
                f"documents={self.num_documents}, tokens={self.num_tokens}, {state})")

    @property
    def location(self) -> str:
        """The cache's URL (on an object store) or directory."""
        return self.store.location

    @property
    def is_megatron(self) -> bool:
        return self.manifest is None

    @property
    def num_tokens(self) -> int:
        return int(self.cum_tokens[-1])

    @property
    def num_documents(self) -> int:
        return int(self.cum_docs[-1])

    @property
    def opened(self) -> Counter[str]:
        """Chunks whose token data this process has read (how often each was mapped)."""
        return self.store.opened

    @property
    def opened_index(self) -> Counter[str]:
        """Chunks whose ``.idx`` this process has read."""
        return self.store.opened_index

    def _extend(self, more: ChunkColumns) -> None:
        """Prefix sums of the chunks appended to the table (``more``)."""
        for name, column in (("cum_tokens", more.tokens), ("cum_docs", more.documents)):
            cum = getattr(self, name)
            setattr(self, name, np.concatenate([cum, cum[-1] + np.cumsum(column)]))

    def refresh(self) -> int:
        """Re-read the ledger; append newly visible chunks; return how many appeared."""
        if self.manifest is None or self.finished:
            return 0
        if self.tail is None:  # where refreshes continue reading the ledger
            self.tail = LedgerTail(self.store)
        view = self.tail.read()  # only what is new: the journal's new records
        if view is None:
            return 0
        differ = self.chunks.same_prefix(view.chunks)
        if differ >= 0:
            new = (view.chunks.stem[differ].decode() if differ < len(view.chunks)
                   else "nothing")
            raise CacheError(f"{self.location}: the ledger reordered published chunks "
                             f"({self.chunks[differ].stem} became {new}); the cache was "
                             "rebuilt under a running reader")
        fresh = view.chunks.tail(len(self.chunks))
        self.chunks.extend(fresh, where=self.store.name(LEDGER_NAME))
        self._extend(fresh)
        self.finished, self.errors, self.sources = view.finished, view.errors, view.sources
        return len(fresh)

    # -- bytes, through the store ----------------------------------------------------------
    def tokens(self, i: int) -> npt.NDArray[np.generic]:
        """Chunk ``i``'s token ids (all its documents concatenated), memory-mapped."""
        return self.store.tokens(i)

    def index(self, i: int) -> MegatronIndex:
        """Chunk ``i``'s parsed ``.idx`` (document lengths), memory-mapped; does not touch
        the chunk's token data."""
        return self.store.index(i)

    def meta(self, i: int) -> ChunkMeta:
        """Chunk ``i``'s metadata (its files' sizes and checksums), checked against the
        ledger."""
        return self.store.meta(i)

    def gather(self, runs: Any) -> npt.NDArray[np.generic]:
        """The tokens of ``runs`` (columns ``chunk, offset, length``: see
        :mod:`shardwise.storage.runs`) concatenated in order, in the cache's dtype, their
        ids checked against the vocabulary: the one call a reader makes per batch."""
        return self.store.gather(runs)

    def with_chunk_file(self, i: int, suffix: str, use: Callable[[Path], _T]) -> _T:
        """``use(local path)`` of chunk ``i``'s file ``suffix`` (``.bin``, ``.idx``, …):
        the file itself, or its checked local copy."""
        return self.store.with_file(self.chunks[i], suffix, use)

    # -- checks as chunks are read (shardwise.storage.integrity) -------------------------
    def raise_if_damaged(self) -> None:
        """Raise the damage background verification found in a chunk this process read
        (a reader calls this once per batch)."""
        if self.checks.verifier is not None:
            self.checks.verifier.raise_if_damaged()

    def wait_for_verify(self) -> None:
        """Block until the chunks read so far are verified; their damage is then raised
        by :meth:`raise_if_damaged`."""
        if self.checks.verifier is not None:
            self.checks.verifier.wait()

    def verify_stats(self) -> dict[str, int]:
        """Background verification so far: chunk checks that ``hashed`` data, that were
        ``skipped`` (verified before on this node), and ``queued``."""
        return self.checks.stats()

    # -- downloads ahead (shardwise.storage.prefetch) --------------------------------------
    def prefetch(self, chunks: Iterable[int]) -> bool:
        """Start fetching chunks ``chunks`` (global indices, in the order they will be
        read) in the background, as far ahead as the measured pace needs and
        ``local_bytes`` allows; errors surface when the chunk is used. Returns whether
        the reader should hand over its coming chunks sooner (never, where the bytes are
        here)."""
        return self.store.prefetch(chunks)

    def prefetch_runs(self, runs: Any) -> bool:
        """:meth:`prefetch` of a coming batch given as its runs (an order's ``locate``):
        on an object store its ranged reads also start now, while its chunks arrive
        (:class:`~shardwise.storage.ranged.EarlyReads`)."""
        return self.store.prefetch_runs(runs)

    def read_early(self, runs: Any) -> bool:
        """The ranged reads of a coming batch (its runs) started now, its chunks not handed
        over (a DataLoader worker's coming batches: its loader's process downloads their
        chunks for the node); a no-op where the bytes are here."""
        return self.store.read_early(runs)

    def reader_pace(self, own_s: float | None) -> None:
        """The reader's own time on its last batch, measured where it trains
        (:meth:`~shardwise.storage.store.ChunkStore.reader_pace`)."""
        self.store.reader_pace(own_s)

    def ready_for_workers(self) -> None:
        """Make now what DataLoader workers forked from this process would each make on
        their first read (:meth:`~shardwise.storage.store.ChunkStore.ready_for_workers`)."""
        self.store.ready_for_workers()

    def prefetch_stats(self) -> dict[str, object]:
        """The downloads ahead: how far, how many at once, and the pace they follow."""
        return self.store.stats()

    def wait_for_prefetch(self) -> None:
        """Block until every download :meth:`prefetch` started has finished (e.g. to warm a
        node's local copy before training); their errors surface when a chunk is used."""
        self.store.wait_for_prefetch()

    def close(self) -> None:
        """Stop background downloads and verification (queued ones are dropped; a chunk
        being hashed is finished) and drop memory maps."""
        self.store.close()

    def doc_lengths(self, i: int) -> npt.NDArray[np.integer]:
        return self.index(i).document_lengths

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.generic]:
        """Tokens ``[start, stop)`` of the concatenated stream (may span chunks)."""
        first = int(np.searchsorted(self.cum_tokens, start, side="right")) - 1
        parts = []
        pos = start
        c = first
        while pos < stop:
            lo = pos - int(self.cum_tokens[c])
            hi = min(stop, int(self.cum_tokens[c + 1])) - int(self.cum_tokens[c])
            parts.append(self.tokens(c)[lo:hi])
            pos += hi - lo
            c += 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)
