"""A run of consecutive documents of a cache, read as a cache of its own.

Why: Megatron's ``split`` ("969,30,1") gives train, valid and test disjoint runs of
documents of one dataset. Documents are stored back to back, so a run of documents is a
run of the token stream, and every token reader (window packing, document shuffle) works
on it unchanged if it sees a cache whose chunks are the cut pieces::

    parent chunks   c0 [d0 d1 d2]   c1 [d3 d4]   c2 [d5 d6 d7]
    documents [2, 6)          c0 [d2]      c1 [d3 d4]   c2 [d5]
    chunk i of the range is tokens [tok_lo, tok_hi) of parent chunk pc

Only the two boundary chunks' ``.idx`` are read to cut them (documents → token offsets);
token data is read through the parent, lazily, as ever. The range is fixed (finished): it
never grows with a cache that is still being built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import fingerprint
from shardwise.errors import CacheError, ConfigError
from shardwise.format.megatron import MegatronIndex
from shardwise.storage.cache import Cache
from shardwise.storage.integrity import CacheChecks
from shardwise.storage.runs import Runs


@dataclasses.dataclass(frozen=True)
class _Piece:
    chunk: int  # the parent's chunk
    doc_lo: int
    doc_hi: int
    tok_lo: int
    tok_hi: int


class DocumentRange(Cache):
    """Documents ``[start, stop)`` of ``parent`` (global document numbers, stored order).

    >>> valid = DocumentRange(open_cache("cache/"), 969, 999)   # doctest: +SKIP
    >>> TokenDataset(valid, seq_len=2048, shuffle="document")   # doctest: +SKIP
    """

    def __init__(self, parent: Cache, start: int, stop: int) -> None:
        n = parent.num_documents
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= n):
            raise ConfigError(f"a document range must satisfy 0 <= start <= stop <= {n} "
                              f"(the documents of {parent.location}), got [{start}, {stop})")
        self.parent, self.start, self.stop = parent, start, stop
        self._pieces = _cut(parent, start, stop)
        chunks = [dataclasses.replace(parent.chunks[p.chunk], documents=p.doc_hi - p.doc_lo,
                                      tokens=p.tok_hi - p.tok_lo) for p in self._pieces]
        # the parent's store, not bound to this view: bytes are read through the parent
        # (locality is counted there); the range's own checks name its pieces
        self._view_of(parent.store, manifest=parent.manifest, chunks=chunks,
                      dtype=parent.dtype, eod_id=parent.eod_id, vocab_size=parent.vocab_size,
                      finished=True, errors=parent.errors, fingerprint=fingerprint(
                          {"parent": parent.fingerprint, "documents": [start, stop]}),
                      verify=parent.verify, sources=())
        self.checks = CacheChecks(parent.store, self, background=False)
        # the parent's background verification covers the chunks read through it: its
        # damage fails the range's batches, and once it is settled ids need no check
        self.checks.verifier = parent.checks.verifier

    def __repr__(self) -> str:
        return (f"DocumentRange({self.parent!r}, documents=[{self.start}, {self.stop}), "
                f"tokens={self.num_tokens})")

    @property
    def location(self) -> str:
        return f"{self.parent.location} documents [{self.start}, {self.stop})"

    def tokens(self, i: int) -> npt.NDArray[np.generic]:
        p = self._pieces[i]
        return self.parent.tokens(p.chunk)[p.tok_lo:p.tok_hi]

    def gather(self, runs: Any) -> npt.NDArray[np.generic]:
        """The parent's gather of the same runs, cut to the range's pieces."""
        return self.parent.gather(self._in_parent(runs))

    def _in_parent(self, runs: Any) -> Runs:
        runs = Runs.of(runs)
        runs.check(self.chunks.columns.tokens, self.location)
        pieces = self._pieces
        parent_chunk = np.asarray([p.chunk for p in pieces], dtype=np.int64)
        tok_lo = np.asarray([p.tok_lo for p in pieces], dtype=np.int64)
        return Runs(parent_chunk[runs.chunk], tok_lo[runs.chunk] + runs.offset, runs.length)

    def prefetch_runs(self, runs: Any) -> bool:
        return self.parent.prefetch_runs(self._in_parent(runs))

    def read_early(self, runs: Any) -> bool:
        return self.parent.read_early(self._in_parent(runs))

    def doc_lengths(self, i: int) -> npt.NDArray[Any]:
        p = self._pieces[i]
        return self.parent.doc_lengths(p.chunk)[p.doc_lo:p.doc_hi]

    def prefetch(self, chunks: Iterable[int]) -> bool:
        return self.parent.prefetch(self._pieces[c].chunk for c in chunks)

    def wait_for_prefetch(self) -> None:
        self.parent.wait_for_prefetch()

    def reader_pace(self, own_s: float | None) -> None:
        self.parent.reader_pace(own_s)

    def ready_for_workers(self) -> None:
        self.parent.ready_for_workers()

    def close(self) -> None:
        self.parent.close()

    def refresh(self) -> int:
        return 0

    def index(self, i: int) -> MegatronIndex:
        self._whole_chunks_only("index")

    def with_chunk_file(self, i: int, suffix: str, use: Any) -> Any:
        self._whole_chunks_only("with_chunk_file")

    def _whole_chunks_only(self, what: str) -> NoReturn:
        raise CacheError(f"{self.location}: a document range cuts chunks, so it has no "
                         f"chunk files of its own ({what}); read it with TokenDataset, or "
                         "give stream readers the whole cache")


def _cut(parent: Cache, start: int, stop: int) -> list[_Piece]:
    """The parent chunks overlapping documents ``[start, stop)``, each cut to the range."""
    cum = parent.cum_docs
    if start == stop:
        return []
    first = int(np.searchsorted(cum, start, side="right")) - 1
    last = int(np.searchsorted(cum, stop, side="left"))  # one past the last chunk used
    out = []
    for c in range(first, last):
        lo, hi = max(start, int(cum[c])) - int(cum[c]), min(stop, int(cum[c + 1])) - int(cum[c])
        if hi <= lo:
            continue
        whole = parent.chunks[c].documents
        lengths = None if (lo == 0 and hi == whole) else parent.doc_lengths(c)
        tok_lo = 0 if lo == 0 else int(np.sum(lengths[:lo], dtype=np.int64))  # type: ignore[index]
        tok_hi = (parent.chunks[c].tokens if hi == whole
                  else int(np.sum(lengths[:hi], dtype=np.int64)))  # type: ignore[index]
        out.append(_Piece(c, lo, hi, tok_lo, tok_hi))
    return out


__all__ = ["DocumentRange"]
