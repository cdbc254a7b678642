"""Record sources cut into *ranges*, and reading one range from any position.

A range is the unit of work of :class:`~shardwise.read.records.stream.RecordStream`:

* uncompressed JSONL: a byte range ``[a, b)`` of about ``step`` bytes, owning every line
  that *starts* inside it. Planning reads no byte of the file (``os.stat`` only): the
  reader of ``[a, b)`` itself skips to the first line start ``>= a`` and stops at the first
  line start ``>= b`` (:func:`~shardwise.sources.discovery.next_line_start`);
* compressed JSONL (``.gz``, ``.zst``): the whole file (a compressed stream cannot be
  entered in the middle);
* Parquet: one row group (row counts come from the footer, a few KB);
* an Arrow IPC file (a Hugging Face ``datasets`` cache file): the whole file, by rows.

A record's position ``pos`` is its first byte (JSONL: offset in the uncompressed stream)
or its row in the file (Parquet, Arrow); ``line`` counts records from the range start.

Worked example (``step = 10`` over the 23 bytes ``aaaa⏎bbbbbbbbb⏎cc⏎dddd⏎``)::

    range [0, 10)    lines starting at 0 (aaaa) and 5 (bbbbbbbbb)
    range [10, 20)   first line start >= 10 is 15: lines 15 (cc) and 18 (dddd)
    range [20, 23)   first line start >= 20 is 23, the end: no line
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from shardwise.errors import ConfigError, InputError
from shardwise.format.ledger import Segment
from shardwise.format.manifest import SourceInfo
from shardwise.plan._checks import IntArray
from shardwise.sources.arrow import iter_arrow
from shardwise.sources.discovery import SourceFormat, discover, next_line_start, source_format
from shardwise.sources.records import iter_lines, iter_parquet

MIN_RANGE_BYTES = 1 << 10
RANGES_PER_STREAM = 4
ALIGN_BLOCK = 4 << 10

Payload = bytes | dict[str, Any] | InputError
Raw = tuple[Payload, int, int, int]
"""``(payload, pos, line, end)``: a record, where it starts, its line in the range, and
where the next one starts."""


class RangeKind(str, Enum):
    LINES = "lines"          # a byte range of an uncompressed JSONL file
    STREAM = "stream"        # a whole compressed JSONL file
    ROW_GROUP = "row_group"  # one Parquet row group
    ARROW = "arrow"          # a whole Arrow IPC file


_KIND = {SourceFormat.JSONL: RangeKind.LINES, SourceFormat.JSONL_GZ: RangeKind.STREAM,
         SourceFormat.JSONL_ZST: RangeKind.STREAM, SourceFormat.PARQUET: RangeKind.ROW_GROUP,
         SourceFormat.ARROW: RangeKind.ARROW}


@dataclass(frozen=True)
class RecordFile:
    """One input file; ``format`` is a :class:`SourceFormat` value."""

    path: str
    size: int
    format: str

    @property
    def kind(self) -> RangeKind:
        return _KIND[SourceFormat(self.format)]

    def info(self) -> SourceInfo:
        return SourceInfo(path=self.path, size=self.size, fingerprint="", format=self.format)


def resolve_files(sources: Any) -> list[RecordFile]:
    """Files from paths, directories, globs, ``.arrow`` files, Hugging Face folders and
    ``datasets.Dataset`` objects (see :func:`~shardwise.sources.discovery.discover`), in
    the order given, duplicates dropped. Only ``os.stat`` touches JSONL and Parquet files."""
    return [RecordFile(path=p, size=os.path.getsize(p), format=_format_of(p))
            for p in discover(sources)]


def _format_of(path: str) -> str:
    fmt = source_format(path)
    if fmt is None:  # discover only returns supported files
        raise ConfigError(f"{path}: unsupported source type")
    return fmt.value


@dataclass(frozen=True)
class RangePlan:
    """Every range of the sources, in file order: ``file[k]``, ``start[k]``, ``stop[k]``
    (bytes for JSONL byte ranges, rows otherwise; ``stop = -1``: to the end)."""

    files: tuple[RecordFile, ...]
    file: IntArray
    start: IntArray
    stop: IntArray
    step: int

    @property
    def n(self) -> int:
        return int(self.file.size)

    def source(self, rid: int) -> RecordFile:
        return self.files[int(self.file[rid])]


def range_step(files: Sequence[RecordFile], range_bytes: int, n_streams: int) -> int:
    """Bytes per JSONL range: at most ``range_bytes``, but small corpora are cut finer so
    that every stream gets about :data:`RANGES_PER_STREAM` ranges (never below 1 KiB
    unless ``range_bytes`` is)."""
    plain = sum(f.size for f in files if f.kind is RangeKind.LINES)
    wanted = -(-plain // (RANGES_PER_STREAM * n_streams))
    return max(1, min(range_bytes, max(MIN_RANGE_BYTES, wanted)))


def plan_ranges(files: Sequence[RecordFile], *, range_bytes: int, n_streams: int) -> RangePlan:
    """The ranges of ``files`` (see the module docstring); reads Parquet footers only."""
    step = range_step(files, range_bytes, n_streams)
    fidx, starts, stops = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i, f in enumerate(files):
        a, b = _file_ranges(f, step)
        fidx.append(np.full(a.size, i, dtype=np.int64))
        starts.append(a)
        stops.append(b)
    return RangePlan(files=tuple(files), file=np.concatenate(fidx), start=np.concatenate(starts),
                     stop=np.concatenate(stops), step=step)


def _file_ranges(f: RecordFile, step: int) -> tuple[IntArray, IntArray]:
    kind = f.kind
    if kind is RangeKind.LINES:
        a = np.arange(0, f.size, step, dtype=np.int64)
        return a, np.minimum(a + step, f.size)
    if kind is RangeKind.ROW_GROUP:
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(f.path).metadata
        rows = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)],
                        dtype=np.int64)
        ends = np.cumsum(rows)
        keep = rows > 0  # an empty row group holds nothing (and shares its start row)
        return (ends - rows)[keep], ends[keep]
    one = np.zeros(1, np.int64)
    return one, one - 1


def iter_range(plan: RangePlan, rid: int, pos: int | None = None, line: int = 0
               ) -> Iterator[Raw]:
    """The records of range ``rid`` from ``pos`` (None: the range start) with ``line``."""
    f = plan.source(rid)
    a, b = int(plan.start[rid]), int(plan.stop[rid])
    kind = f.kind
    if kind is RangeKind.LINES:
        return _iter_byte_range(f, a, b, pos, line)
    if kind is RangeKind.STREAM:
        return _with_starts(iter_lines(f.info(), Segment(0, -1, 0), pos or 0, line), pos or 0)
    if kind is RangeKind.ROW_GROUP:
        return _iter_row_group(f, a, b, a if pos is None else pos)
    return _iter_arrow(f.path, pos or 0, line)


def _with_starts(lines: Iterator[tuple[bytes | InputError, int, int]], pos: int
                 ) -> Iterator[Raw]:
    for raw, end, ln in lines:
        yield raw, pos, ln, end
        pos = end


def _iter_row_group(f: RecordFile, a: int, b: int, pos: int) -> Iterator[Raw]:
    for loc in iter_parquet(f.info(), Segment(a, b, a), pos, None):
        yield loc.value, loc.end - 1, loc.line, loc.end


def _iter_byte_range(f: RecordFile, a: int, b: int, pos: int | None, line: int
                     ) -> Iterator[Raw]:
    with open(f.path, "rb", buffering=0) as fh:
        start = next_line_start(fh, a, f.size, ALIGN_BLOCK) if pos is None else pos
        stop = next_line_start(fh, b, f.size, ALIGN_BLOCK) if b < f.size else f.size
    if start < stop:
        lines = iter_lines(f.info(), Segment(start, stop, start), start,
                           0 if pos is None else line)
        for raw, end, ln in lines:  # _with_starts, inlined: this is the hot loop
            yield raw, start, ln, end
            start = end


def _iter_arrow(path: str, pos: int, line: int) -> Iterator[Raw]:
    """Rows from ``pos`` (:func:`~shardwise.sources.arrow.iter_arrow`)."""
    for rec, r in iter_arrow(path, pos):
        yield rec, r, line, r + 1
        line += 1


def fetch(plan: RangePlan, where: Sequence[tuple[int, int, int]]) -> list[Payload]:
    """The payloads of records ``(range, pos, line)`` (a shuffle buffer being restored).

    JSONL byte ranges seek to each record; other ranges are read once from the first
    wanted record (a compressed file is decompressed up to its last wanted record)."""
    out: list[Payload | None] = [None] * len(where)
    by_range: dict[int, list[int]] = {}
    for i, (rid, _, _) in enumerate(where):
        by_range.setdefault(rid, []).append(i)
    for rid, idx in by_range.items():
        f = plan.source(rid)
        if f.kind is RangeKind.LINES:
            with open(f.path, "rb") as fh:
                for i in sorted(idx, key=lambda i: where[i][1]):
                    fh.seek(where[i][1])
                    data = fh.readline()
                    out[i] = data[:-1] if data.endswith(b"\n") else data
            continue
        wanted = {where[i][1]: i for i in idx}
        first = min(idx, key=lambda i: where[i][1])
        for payload, pos, _, _ in iter_range(plan, rid, where[first][1], where[first][2]):
            if pos in wanted:
                out[wanted.pop(pos)] = payload
                if not wanted:
                    break
        if wanted:
            raise InputError(f"{f.path}: a record saved in the shuffle buffer at position "
                             f"{min(wanted)} is no longer there; the file changed since the "
                             "state was saved", path=f.path, reason="changed_file")
    return [p for p in out if p is not None]
