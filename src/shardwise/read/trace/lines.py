"""From token offsets of a cache to documents, and from documents to source lines.

A run of the stored token stream ``[start, stop)`` is cut at document boundaries into
*pieces* (chunk, document within it, offset in the document, tokens), using only the
chunks' ``.idx`` (document lengths), never their tokens. A document's source line comes
from its chunk's metadata (format/SPEC.md): document ``k`` of a chunk is the ``k``-th
line of the chunk's ``range`` that is not in ``skipped_lines``; the lines of the source's
earlier segments come from the ledger. Worked example (a chunk of segment 1 whose range
is lines 10‥15 of the segment, 12 skipped; segment 0 holds 100 lines)::

    lines of the range   10 11 12 13 14      skipped_lines [12]
    documents            0  1  -  2  3       document 2 → line 13 of the segment
                                             → line 100 + 13 + 1 = 114 of the file

Each look-up is O(log) in the chunk's documents; chunk metadata and document starts are
kept in small LRUs, so a step's pieces cost one ``.idx`` and one ``.json`` per chunk.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.format.ledger import Ledger
from shardwise.storage.cache import Cache

KEEP = 256


@dataclass(frozen=True)
class Where:
    """Where a document came from: the file, its 1-based ``line`` (JSONL; ``None`` when
    the cache cannot say, with ``note`` why) or ``row`` (Parquet, 0-based), and its
    chunk with the chunk's source range (``unit`` byte or row)."""

    source_path: str
    chunk: str
    unit: str
    range_start: int
    range_stop: int
    line: int | None = None
    row: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {"source_path": self.source_path, "chunk": self.chunk,
               f"chunk_{self.unit}s": [self.range_start, self.range_stop]}
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


class Documents:
    """Pieces and source lines of one cache."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._starts: OrderedDict[int, npt.NDArray[np.int64]] = OrderedDict()
        self._where: OrderedDict[int, tuple[Any, list[int]]] = OrderedDict()
        self._seg_lines: dict[int, list[int]] | None = None
        self._cum: list[int] = cache.cum_tokens.tolist()

    # -- pieces ---------------------------------------------------------------------------
    def doc_starts(self, c: int) -> npt.NDArray[np.int64]:
        """Chunk ``c``'s document starts relative to the chunk (documents + 1 values)."""
        hit = self._starts.get(c)
        if hit is None:
            lengths = np.asarray(self.cache.doc_lengths(c), dtype=np.int64)
            hit = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=hit[1:])
            self._starts[c] = hit
            if len(self._starts) > KEEP:
                self._starts.popitem(last=False)
        else:
            self._starts.move_to_end(c)
        return hit

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """``(chunk, document in chunk, offset in document, tokens)`` covering stored
        tokens ``[start, stop)`` in order (empty documents hold no token: none is named)."""
        out, cum, pos = [], self._cum, start
        while pos < stop:
            c = bisect_right(cum, pos) - 1
            starts = self.doc_starts(c)
            rel = pos - cum[c]
            k = int(np.searchsorted(starts, rel, side="right")) - 1
            n = min(stop - pos, int(starts[k + 1]) - rel)
            out.append((c, k, rel - int(starts[k]), n))
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
        return self._cum[c] + int(self.doc_starts(c)[k])

    # -- lines ----------------------------------------------------------------------------
    def where(self, c: int, k: int) -> Where:
        """The source file and line of document ``k`` of chunk ``c``."""
        info = self.cache.chunks[c]
        if self.cache.manifest is None:  # a Megatron prefix: no sources recorded
            return Where(f"{info.base}.bin", info.stem, "document", k, k + 1,
                         note="a Megatron dataset records no source lines")
        meta, skipped = self._meta(c)
        r = meta.range
        lines = r.line_stop - r.line_start
        base = dict(source_path=meta.source_path, chunk=info.stem, unit=r.unit,
                    range_start=r.start, range_stop=r.stop)
        if meta.skipped_lines is None and meta.documents != lines:
            return Where(**base, note=(  # type: ignore[arg-type]
                f"{lines - meta.documents} records of this chunk's {lines} lines were "
                "skipped by a build that did not record which (rebuild for exact lines)"))
        x = r.line_start + k
        for s in skipped:  # the k-th line of the range that is not skipped
            if s > x:
                break
            x += 1
        if r.unit == "row":
            return Where(**base, row=r.start + x - r.line_start)  # type: ignore[arg-type]
        return Where(**base, line=self._lines_before(meta.source, meta.segment) + x + 1)  # type: ignore[arg-type]

    def _meta(self, c: int) -> tuple[Any, list[int]]:
        hit = self._where.get(c)
        if hit is None:
            meta = self.cache.meta(c)
            hit = self._where[c] = (meta, sorted(meta.skipped_lines or ()))
            if len(self._where) > KEEP:
                self._where.popitem(last=False)
        return hit

    def _lines_before(self, source: int, segment: int) -> int:
        """Lines of ``source``'s segments before ``segment`` (each finished: its chunk is
        visible only then), from the ledger, read once."""
        if self._seg_lines is None:
            ledger = Ledger.load(self.cache.store or self.cache.root)
            self._seg_lines = {}
            for s, src in enumerate(ledger.sources):
                acc, out = 0, []
                for seg in src.segments:
                    out.append(acc)
                    acc += seg.line
                self._seg_lines[s] = out
        return self._seg_lines[source][segment]
