"""The ledger's index: what a reader needs from ``ledger.json``, as columns, beside it.

Why: a reader needs only the visible chunk order (stem, source, documents, tokens and
metadata checksum per chunk) and a few totals, but ``ledger.json`` is every segment and
chunk as JSON: at 100,000 chunks it is 10 MB that every rank would parse into 100,000
objects on open, and again on every poll in follow mode. ``ledger.index`` holds the same
facts as flat arrays that one ``frombuffer`` turns into numpy columns.

The ledger stays the truth. Each save writes ``ledger.json`` and then ``ledger.index``,
which records the xxh3-64 of the ledger bytes it was made from; a reader hashes the
ledger (a few ms at 100,000 chunks) and uses the index only when the hashes agree, so an
index older than its ledger (a reader between the two writes, a build killed between
them, a cache from before the index) is never used: the reader parses the ledger.

Layout (little-endian)::

    8 bytes   magic b"SWLIDX\\x00\\x01"
    u64       header length H
    H bytes   header: compact JSON, keys sorted, zero-padded to a multiple of 8 bytes
    columns   each ``chunks`` values of its dtype, in the header's order, each padded to 8

    header = {"version": 1, "ledger_xxh3": …, "data_xxh3": … (of everything after the
              header), "chunks": n, "columns": [["stem", "|S24"], ["source", "<i4"],
              ["documents", "<i8"], ["tokens", "<i8"], ["meta_xxh3", "|S16"]],
              "manifest_xxh3": …, "finished": …, "errors": {…},
              "sources": [{"chunks", "documents", "tokens", "empty", "finished",
                           "errors", "lines"}, …]}  (per source: every chunk the ledger
                                                     names; the lines its segments read)
"""

from __future__ import annotations

import re
import struct
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from shardwise.errors import ManifestError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.ledger_check import MAX_COUNT, MAX_TOTAL, is_count, stem_problem

if TYPE_CHECKING:
    from shardwise.format.ledger import ChunkEntry, Ledger

INDEX_NAME = "ledger.index"
INDEX_VERSION = 1
MAGIC = b"SWLIDX\x00\x01"
_NUMBERS = {"source": "<i4", "documents": "<i8", "tokens": "<i8"}
_TEXTS = ("stem", "meta_xxh3")
COLUMNS = ("stem", "source", "documents", "tokens", "meta_xxh3")


@dataclass(frozen=True)
class SourceTotals:
    """One source: every chunk the ledger names for it (visible or not)."""

    chunks: int
    documents: int
    tokens: int
    empty: int
    finished: bool
    errors: dict[str, int] = field(default_factory=dict)
    lines: int | None = None
    """The lines (rows) its segments read (their ``line``s): every one became a document
    or a skipped record (:func:`~.ledger_check.lines_problem`). None in an index written
    before it was kept (not checked; the ledger itself still is, when parsed)."""


@dataclass(frozen=True)
class ChunkColumns:
    """Chunks as columns: ``stem`` and ``meta_xxh3`` are ASCII bytes (numpy ``S``)."""

    stem: npt.NDArray[np.bytes_]
    source: npt.NDArray[np.int32]
    documents: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    meta_xxh3: npt.NDArray[np.bytes_]

    def __len__(self) -> int:
        return len(self.stem)

    @classmethod
    def from_order(cls, order: list[tuple[int, ChunkEntry]]) -> ChunkColumns:
        """From ``Ledger.global_order()``'s ``(source, entry)`` pairs."""
        entries, n = [e for _, e in order], len(order)
        return cls(_texts([e.stem for e in entries]),
                   np.fromiter((s for s, _ in order), dtype=np.int32, count=n),
                   np.fromiter((e.documents for e in entries), dtype=np.int64, count=n),
                   np.fromiter((e.tokens for e in entries), dtype=np.int64, count=n),
                   _texts([e.meta_xxh3 for e in entries]))

    def tail(self, start: int) -> ChunkColumns:
        return ChunkColumns(*(getattr(self, k)[start:] for k in COLUMNS))

    def concat(self, more: ChunkColumns) -> ChunkColumns:
        return ChunkColumns(*(np.concatenate([getattr(self, k), getattr(more, k)])
                              for k in COLUMNS))


def _texts(values: list[str]) -> npt.NDArray[np.bytes_]:
    """``values`` as a bytes column (numpy encodes ASCII in C; anything else as UTF-8)."""
    try:
        return np.array(values or [""], dtype=np.bytes_)[:len(values)]
    except UnicodeEncodeError:
        return np.array([v.encode() for v in values], dtype=np.bytes_)


@dataclass(frozen=True)
class LedgerView:
    """A reader's view of a ledger: its visible chunk order and totals."""

    manifest_xxh3: str
    finished: bool
    errors: dict[str, int]
    sources: list[SourceTotals]
    chunks: ChunkColumns

    @classmethod
    def from_ledger(cls, ledger: Ledger) -> LedgerView:
        totals = [SourceTotals(sum(len(g.chunks) for g in src.segments),
                               sum(e.documents for g in src.segments for e in g.chunks),
                               sum(e.tokens for g in src.segments for e in g.chunks),
                               src.empty_documents(), src.finished, src.errors(),
                               sum(g.line for g in src.segments))
                  for src in ledger.sources]
        return cls(ledger.manifest_xxh3, ledger.finished, ledger.errors(), totals,
                   ChunkColumns.from_order(ledger.global_order()))

    def differences(self, other: LedgerView) -> list[str]:
        """What differs from ``other`` (the view parsed from the ledger), one line each."""
        if any(s.lines is None for s in self.sources):  # an index from before ``lines``
            other = replace(other, sources=[replace(s, lines=None) for s in other.sources])
        out = [f"{k} {getattr(self, k)!r}, the ledger's is {getattr(other, k)!r}"
               for k in ("manifest_xxh3", "finished", "errors", "sources")
               if getattr(self, k) != getattr(other, k)]
        if len(self.chunks) != len(other.chunks):
            return [*out, f"{len(self.chunks)} visible chunks, the ledger has "
                          f"{len(other.chunks)}"]
        for k in COLUMNS:
            ours, theirs = getattr(self.chunks, k), getattr(other.chunks, k)
            differ = np.flatnonzero(ours != theirs)
            if len(differ):
                c = int(differ[0])
                out.append(f"chunk {c}'s {k} is {ours[c]!r}, the ledger's {theirs[c]!r}")
        return out

    def to_bytes(self, ledger_xxh3: str) -> bytes:
        """The ``ledger.index`` file for the ledger whose bytes hash to ``ledger_xxh3``."""
        columns = [(k, getattr(self.chunks, k)) for k in COLUMNS]
        data = b"".join(_pad(np.ascontiguousarray(a).tobytes()) for _, a in columns)
        header = {"version": INDEX_VERSION, "ledger_xxh3": ledger_xxh3,
                  "data_xxh3": bytes_checksum(data), "chunks": len(self.chunks),
                  "columns": [[k, a.dtype.str] for k, a in columns],
                  "manifest_xxh3": self.manifest_xxh3, "finished": self.finished,
                  "errors": self.errors, "sources": [asdict(s) for s in self.sources]}
        head = _pad(orjson.dumps(header, option=orjson.OPT_SORT_KEYS))
        return MAGIC + struct.pack("<Q", len(head)) + head + data

    @classmethod
    def from_bytes(cls, data: bytes, *, ledger_xxh3: str, where: str) -> LedgerView | None:
        """The view an index file holds, or None if it was made from other ledger bytes
        than those hashing to ``ledger_xxh3`` (stale). A damaged index raises
        :class:`ManifestError` naming ``where``."""
        header, start = _header(data, where)
        if header.get("ledger_xxh3") != ledger_xxh3:
            return None
        try:
            if bytes_checksum(memoryview(data)[start:]) != header["data_xxh3"]:
                raise ValueError("its columns do not match their checksum")
            chunks = _columns(data, start, header)
            sources = [_totals(s) for s in header["sources"]]
            check_columns(chunks, len(sources))
            check_totals(chunks, sources, finished=bool(header["finished"]))
            return cls(str(header["manifest_xxh3"]), bool(header["finished"]),
                       dict(header["errors"]), sources, chunks)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ManifestError(f"{where}: damaged ledger index ({e})") from e


_SUSPECT = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f\\]|\n/|/\n|//|\n\n|(?:\n|/)\.{1,2}(?:/|\n)|://")


def check_columns(chunks: ChunkColumns, sources: int) -> None:
    """What :mod:`.ledger_check` refuses in a ledger, over the columns at numpy speed
    (a hostile index may be consistent with its checksums): counts >= 0, sources in
    range, each stem once, and a relative path inside the cache (one scan of the joined
    bytes; only a suspect is checked stem by stem, to name it). ValueError."""
    for k in ("documents", "tokens"):
        column = getattr(chunks, k)
        if len(column) and not 0 <= int(column.min()) <= int(column.max()) <= MAX_COUNT:
            c = int(np.argmin(column)) if int(column.min()) < 0 else int(np.argmax(column))
            raise ValueError(f"chunk {c} ({chunks.stem[c]!r}): {k} {int(column[c])}, "
                             f"expected a count in [0, {MAX_COUNT}]")
        if int(column.max(initial=0)) * len(column) > MAX_TOTAL and sum(
                column.tolist()) > MAX_TOTAL:
            raise ValueError(f"the chunks' {k} add up past {MAX_TOTAL}")
    if len(chunks.source) and not 0 <= int(chunks.source.min()) <= int(
            chunks.source.max()) < sources:
        raise ValueError(f"chunk sources outside [0, {sources})")
    if len(np.unique(chunks.stem)) != len(chunks.stem):
        values, counts = np.unique(chunks.stem, return_counts=True)
        raise ValueError(f"stem {values[np.argmax(counts)]!r} named more than once")
    stems = chunks.stem.tolist()
    width = chunks.stem.dtype.itemsize
    cells = chunks.stem.view(np.uint8).reshape(len(stems), width) if width else None
    # a control character, or a NUL before the padding ends: not in the joined scan below,
    # whose separator a stem could hold
    hidden = cells is not None and bool(
        (((cells > 0) & (cells < 32)) | (cells == 127)).any()
        or ((cells[:, :-1] == 0) & (cells[:, 1:] != 0)).any())
    if hidden or _SUSPECT.search(b"\n" + b"\n".join(stems) + b"\n"):
        for stem in stems:
            why = stem_problem(stem.decode(errors="replace"))
            if why:
                raise ValueError(f"a chunk {why}")


def check_totals(chunks: ChunkColumns, sources: list[SourceTotals], *, finished: bool
                 ) -> None:
    """The visible chunks add up to the sources' totals (of every chunk the ledger names):
    equal once the ledger is finished (every chunk is visible), at most before. An index
    whose one count was edited, and its checksums made again, is caught here, even for a
    chunk no reader would open (a last chunk shrunk into the tail a reader drops). ValueError."""
    for k in ("chunks", "documents", "tokens"):
        got = np.zeros(len(sources), np.int64)
        np.add.at(got, chunks.source, 1 if k == "chunks" else getattr(chunks, k))
        for s, total in enumerate(sources):
            want = getattr(total, k)
            if int(got[s]) != want if finished else int(got[s]) > want:
                raise ValueError(f"source {s}'s visible chunks hold {int(got[s])} {k}, its "
                                 f"totals say {want}")
    for s, total in enumerate(sources):
        if total.lines is not None and total.documents + sum(total.errors.values()) < \
                total.lines:
            raise ValueError(f"source {s}'s chunks hold {total.documents} documents and it "
                             f"skipped {sum(total.errors.values())} records, but it read "
                             f"{total.lines} lines (rows): a chunk is missing from the ledger")


def _totals(s: dict[str, Any]) -> SourceTotals:
    totals = SourceTotals(**s)
    counts = (totals.chunks, totals.documents, totals.tokens, totals.empty,
              0 if totals.lines is None else totals.lines)
    if not all(is_count(v) for v in counts) or not isinstance(totals.errors, dict) or not all(
            is_count(v) for v in totals.errors.values()):
        raise ValueError(f"source totals {s!r:.100}, expected counts")
    return totals


def _pad(b: bytes) -> bytes:
    return b + b"\x00" * (-len(b) % 8)


def _header(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    """The header and where the columns start."""
    if len(data) < 16 or data[:8] != MAGIC:
        raise ManifestError(f"{where}: not a shardwise ledger index (magic {data[:8]!r}, "
                            f"expected {MAGIC!r})")
    (size,) = struct.unpack_from("<Q", data, 8)
    try:
        header = orjson.loads(data[16:16 + size].rstrip(b"\x00"))
    except orjson.JSONDecodeError as e:
        raise ManifestError(f"{where}: damaged ledger index header ({e})") from e
    if not isinstance(header, dict) or header.get("version") != INDEX_VERSION:
        version = header.get("version") if isinstance(header, dict) else None
        raise ManifestError(f"{where}: ledger index version {version!r}, this shardwise "
                            f"reads {INDEX_VERSION}")
    return header, 16 + size


def _columns(data: bytes, offset: int, header: dict[str, Any]) -> ChunkColumns:
    n = int(header["chunks"])
    names = [c[0] for c in header["columns"]]
    if names != list(COLUMNS) or n < 0:
        raise ValueError(f"columns {names} of {n} chunks, expected {list(COLUMNS)}")
    out = {}
    for name, dtype_str in header["columns"]:
        dtype = np.dtype(_NUMBERS.get(name, "|S1"))
        if name in _TEXTS:
            dtype = np.dtype(str(dtype_str))
            if dtype.kind != "S":
                raise ValueError(f"column {name} has dtype {dtype_str}, expected bytes")
        elif dtype_str != dtype.str:
            raise ValueError(f"column {name} has dtype {dtype_str}, expected {dtype.str}")
        out[name] = np.frombuffer(data, dtype=dtype, count=n, offset=offset)
        offset += n * dtype.itemsize + (-(n * dtype.itemsize) % 8)
    if offset != len(data):
        raise ValueError(f"{len(data)} bytes, its columns take {offset}")
    return ChunkColumns(**out)
