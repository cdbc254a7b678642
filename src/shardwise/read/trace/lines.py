"""From token offsets of a cache to documents, and from documents to source lines.

A run of the stored token stream ``[start, stop)`` is cut at document boundaries into
*pieces* (chunk, document within it, offset in the document, tokens), using only the
chunks' ``.idx`` (document pointers), never their tokens. A document's source line:

* in a segment where the ledger counts no skipped record (the common case), every line
  is a document: the line is the documents of the segment before it, plus the lines of
  the source's earlier segments (the ledger's ``line``) — no chunk file is read;
* else from its chunk's metadata (format/SPEC.md): document ``k`` of a chunk is the
  ``k``-th line of the chunk's ``range`` not in ``skipped_lines``.

Worked example (a chunk of segment 1 whose range is lines 10‥15 of the segment, 12
skipped; segment 0 holds 100 lines)::

    lines of the range   10 11 12 13 14      skipped_lines [12]
    documents            0  1  -  2  3       document 2 → line 13 of the segment
                                             → line 100 + 13 + 1 = 114 of the file

Each look-up is O(log) in the chunk's documents; chunk metadata and document starts are
kept in small LRUs, so a step's pieces cost one ``.idx`` per chunk (and its ``.json``
where records were skipped), plus the ledger once.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.bounded import Bounded
from shardwise.errors import CorruptChunkError
from shardwise.format.ledger import Ledger
from shardwise.format.manifest import IMPORTED_FORMATS
from shardwise.format.megatron import read_idx
from shardwise.sources.discovery import SourceFormat
from shardwise.storage.cache import Cache

KEEP = 256


@dataclass(frozen=True)
class Where:
    """Where a document came from: the file, its 1-based ``line`` (JSONL; ``None`` when
    the cache cannot say, with ``note`` why) or ``row`` (Parquet, Arrow; 0-based), its chunk,
    and the source range of the chunk's segment (``unit`` byte or row)."""

    source_path: str
    chunk: str
    unit: str
    range_start: int
    range_stop: int
    line: int | None = None
    row: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source_path": self.source_path, "chunk": self.chunk,
               f"segment_{self.unit}s": [self.range_start, self.range_stop]}
        if self.row is not None:
            out["row"] = self.row
        else:
            out["line"] = self.line
        if self.note:
            out["note"] = self.note
        return out

    def label(self) -> str:
        """``file:line`` (or ``file row N``) for a human."""
        if self.row is not None:
            return f"{self.source_path} row {self.row}"
        if self.line is not None:
            return f"{self.source_path}:{self.line}"
        return f"{self.source_path} {self.unit}s [{self.range_start}, {self.range_stop})"


class _Starts:
    """A chunk's document starts in tokens without converting a whole array: ``arr``
    holds them in units of ``scale`` (a ``.idx``'s byte pointers, memory-mapped: a
    binary search reads a few pages), index ``len(arr)`` is the chunk's total."""

    def __init__(self, arr: npt.NDArray[np.int64], scale: int, total: int,
                 lengths: npt.NDArray[np.integer], name: str) -> None:
        self.arr, self.scale, self.total = arr, scale, total
        self.lengths, self.name = lengths, name

    def __getitem__(self, k: int) -> int:
        return self.total if k >= len(self.arr) else int(self.arr[k]) // self.scale

    def find(self, rel: int) -> int:
        """The document holding token ``rel`` (the last of equal starts: empty documents
        before a non-empty one hold no token), checked against its length."""
        k = int(np.searchsorted(self.arr, rel * self.scale, side="right")) - 1
        self.check(k)
        return k

    def check(self, k: int) -> None:
        """Document ``k``'s start plus its length is the next start (or the total)."""
        if not 0 <= k < len(self.arr) or self[k] + int(self.lengths[k]) != self[k + 1]:
            raise CorruptChunkError(f"{self.name}: document {k}'s pointer and length "
                                    "disagree with the next document's (or the ledger's "
                                    "token count); run 'shardwise verify' on the cache")


class Documents:
    """Pieces and source lines of one cache."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._starts: Bounded[int, _Starts] = Bounded(KEEP)
        self._where: Bounded[int, tuple[Any, list[int]]] = Bounded(KEEP)
        self._segs: dict[str, _Segment] | None = None
        self._cum: list[int] = cache.cum_tokens.tolist()

    # -- pieces ---------------------------------------------------------------------------
    def _pointers(self, c: int) -> _Starts:
        """Chunk ``c``'s document starts: the ``.idx``'s sequence pointers when every
        document is one sequence, else prefix sums (a Megatron dataset of multi-sequence
        documents).

        The ``.idx`` is mapped without the reader's full structure check (O(documents)
        per chunk: most of a step's cost, as a step touches a chunk per example); each
        document trace names is checked instead (:meth:`_Starts.check`), and a reader
        still checks the whole file before it reads a token of the chunk."""
        hit = self._starts.get(c)
        if hit is None:
            idx = self.cache.with_chunk_file(c, ".idx", read_idx)
            total = self._cum[c + 1] - self._cum[c]
            if idx.num_documents == idx.num_sequences:
                hit = _Starts(idx.sequence_pointers, idx.dtype.itemsize, total,
                              idx.sequence_lengths, self._name(c))
            else:
                lengths = np.asarray(idx.document_lengths, dtype=np.int64)
                hit = _Starts(np.concatenate([[0], np.cumsum(lengths[:-1])]), 1, total,
                              lengths, self._name(c))
            self._starts.put(c, hit)
        return hit

    def _name(self, c: int) -> str:
        return f"{self.cache.chunks[c].base}.idx"

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """``(chunk, document in chunk, offset in document, tokens)`` covering stored
        tokens ``[start, stop)`` in order (empty documents hold no token: none is named)."""
        out, cum, pos = [], self._cum, start
        while pos < stop:
            c = bisect_right(cum, pos) - 1
            starts = self._pointers(c)
            rel = pos - cum[c]
            k = starts.find(rel)
            begin, end = starts[k], starts[k + 1]
            n = min(stop - pos, end - rel)
            out.append((c, k, rel - begin, n))
            pos += n
        return out

    def document_id(self, c: int, k: int) -> int:
        """The cache-wide index (ledger order) of document ``k`` of chunk ``c``."""
        return int(self.cache.cum_docs[c]) + k

    def chunk_of_document(self, d: int) -> tuple[int, int]:
        """``(chunk, document in chunk)`` of cache-wide document ``d``."""
        c = int(np.searchsorted(self.cache.cum_docs, d, side="right")) - 1
        return c, d - int(self.cache.cum_docs[c])

    def document_start(self, c: int, k: int) -> int:
        """Stored-stream offset of document ``k`` of chunk ``c``."""
        return self._cum[c] + self._pointers(c)[k]

    # -- lines ----------------------------------------------------------------------------
    def where(self, c: int, k: int) -> Where:
        """The source file and line (or row) of document ``k`` of chunk ``c``."""
        info = self.cache.chunks[c]
        m = self.cache.manifest
        if m is None:  # a Megatron prefix: no sources recorded
            return Where(f"{info.base}.bin", info.stem, "document", k, k + 1,
                         note="a Megatron dataset records no source lines")
        seg = self._segments()[info.stem]
        fmt = m.sources[info.source].format
        unit = "row" if fmt in IMPORTED_FORMATS else SourceFormat(fmt).unit
        here = Where(m.sources[info.source].shown, info.stem, unit, seg.start, seg.stop)
        if seg.clean:  # every line of the segment is a document: no chunk metadata needed
            x: int | None = seg.docs_before + k
        else:
            x = self._line_from_meta(c, k)
        if x is None:
            return replace(here, note="records of this chunk were skipped by a build that "
                                      "did not record which (rebuild it for exact lines)")
        if unit == "row":
            return replace(here, row=seg.start + x)
        return replace(here, line=seg.lines_before + x + 1)

    def _line_from_meta(self, c: int, k: int) -> int | None:
        """Document ``k``'s line in its segment from the chunk's ``skipped_lines``."""
        hit = self._where.get(c)
        if hit is None:
            meta = self.cache.meta(c)
            hit = self._where.put(c, (meta, sorted(meta.skipped_lines or ())))
        meta, skipped = hit
        r = meta.range
        if meta.skipped_lines is None and meta.documents != r.line_stop - r.line_start:
            return None
        x = r.line_start + k
        for s in skipped:  # the k-th line of the range that is not skipped
            if s > x:
                break
            x += 1
        return int(x)

    def _segments(self) -> dict[str, _Segment]:
        """Each chunk's segment facts from the ledger, read once."""
        if self._segs is None:
            ledger = Ledger.load(self.cache.store)
            self._segs = {}
            for src in ledger.sources:
                lines = 0
                for seg in src.segments:
                    docs = sum(e.documents for e in seg.chunks)
                    clean = seg.finished and not seg.errors and seg.line == docs
                    before = 0
                    for e in seg.chunks:
                        self._segs[e.stem] = _Segment(seg.start, seg.stop, lines, before, clean)
                        before += e.documents
                    lines += seg.line
        return self._segs


@dataclass(frozen=True)
class _Segment:
    """A chunk's segment: its source range, the lines of the source before it, the
    documents of the segment before the chunk, and whether every line is a document."""

    start: int
    stop: int
    lines_before: int
    docs_before: int
    clean: bool
