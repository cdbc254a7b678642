"""Reading the records of one segment, with the position after each one.

Every record comes with ``end`` (where the next record starts: a byte offset of the
uncompressed stream, or a row number of a Parquet or Arrow file) and ``line`` (0-based,
counted from the segment's start), so a worker can publish a chunk with the exact
position to resume from. Bad input
comes back as an :class:`~shardwise.errors.InputError` *value* in place of the record, so
the caller decides whether to raise or count it.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from shardwise.errors import InputError
from shardwise.format.ledger import Segment
from shardwise.format.manifest import SourceInfo
from shardwise.sources.arrow import arrow_schema_names, iter_arrow
from shardwise.sources.bucket import Options, open_source, parquet_input
from shardwise.sources.discovery import SourceFormat
from shardwise.sources.fields import top_columns

BLOCK = 4 << 20
DEFAULT_MAX_RECORD_BYTES = 256 << 20


@dataclass(frozen=True)
class Located:
    """A record (a dict) or the error it raised, and where it ends."""

    value: dict[str, Any] | InputError
    end: int
    line: int


def absolute_line(path: str, segment_start: int, line_in_segment: int,
                  storage_options: Options = None) -> int:
    """1-based line number in the file; counts newlines before the segment only on demand
    (it is used for error messages, never on the hot path)."""
    if segment_start <= 0:
        return line_in_segment + 1
    newlines = 0
    with open_source(path, storage_options) as f:
        remaining = segment_start
        while remaining > 0:
            block = f.read(min(BLOCK, remaining))
            if not block:
                break
            newlines += block.count(b"\n")
            remaining -= len(block)
    return newlines + line_in_segment + 1


def _open_stream(info: SourceInfo, storage_options: Options = None,
                 until: int | None = None) -> BinaryIO:
    """The (decompressed) stream; an object in a bucket is read ahead below ``until``."""
    fmt = SourceFormat(info.format)
    # closed by the wrapper or the caller
    raw = open_source(info.path, storage_options, size=info.size,
                      ahead_until=info.size if until is None else until)
    if fmt is SourceFormat.JSONL_GZ:
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        gz.myfileobj = raw  # type: ignore[assignment]  # closing gz then closes the file
        return gz  # type: ignore[return-value]
    if fmt is SourceFormat.JSONL_ZST:
        return _ZstdStream(raw)  # type: ignore[return-value]
    return raw


class _ZstdStream(io.RawIOBase):
    """A zstd stream over any number of frames that raises EOFError when the input ends
    inside a frame (``zstandard``'s stream reader returns a silent EOF there)."""

    def __init__(self, raw: BinaryIO) -> None:
        import zstandard

        self._raw = raw
        self._zstd = zstandard.ZstdDecompressor()
        self._dobj = self._zstd.decompressobj()
        self._in_frame = False
        self._buf = b""

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        while not self._buf:
            data = self._raw.read(1 << 20)
            if not data:
                if self._in_frame:
                    raise EOFError("zstd input ended inside a frame")
                return b""
            while data:
                self._in_frame = True
                self._buf += self._dobj.decompress(data)
                if not self._dobj.eof:
                    break
                self._in_frame = False
                data = self._dobj.unused_data
                self._dobj = self._zstd.decompressobj()
        n = len(self._buf) if n is None or n < 0 else n
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        return self.read1(n)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _truncated(info: SourceInfo, seg: Segment, pos: int, line: int, err: Exception
               ) -> InputError:
    return InputError(f"{info.shown}: compressed stream is truncated or damaged after "
                      f"{pos} uncompressed bytes (line {line + 1}): {err}",
                      path=info.shown, line=line + 1, reason="truncated_file")


def _seek(f: Any, position: int, compressed: bool) -> tuple[int, Exception | None]:
    """Move ``f`` to ``position``: a plain file seeks; a compressed stream is decompressed
    from its start and the bytes before ``position`` discarded. Returns the position
    reached and the error that stopped a damaged stream short."""
    if not compressed:
        f.seek(position)
        return position, None
    pos = 0
    try:
        while pos < position:
            skipped = f.read(min(BLOCK, position - pos))
            if not skipped:
                break
            pos += len(skipped)
    except (EOFError, OSError, ValueError) as e:
        return pos, e
    return pos, None


def iter_lines(info: SourceInfo, seg: Segment, position: int, line: int,
               max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
               storage_options: Options = None
               ) -> Iterator[tuple[bytes | InputError, int, int]]:
    """``(line_bytes, end, line_no)`` for each line starting in ``[position, seg.stop)``.

    ``seg.stop == -1`` means to the end of the (decompressed) stream. A compressed stream
    is decompressed from its start and the bytes before ``position`` are discarded. A UTF-8
    byte order mark at the start of the stream is skipped. A line longer than
    ``max_record_bytes`` comes as a ``too_large`` :class:`InputError`: its bytes are
    scanned for the newline, never held (see :class:`_LongLine`).
    """
    stop = seg.stop
    compressed = SourceFormat(info.format) is not SourceFormat.JSONL
    with _open_stream(info, storage_options, None if stop < 0 else stop) as f:
        pos, damaged = _seek(f, position, compressed)
        if damaged is not None:
            yield _truncated(info, seg, pos, line, damaged), pos, line
            return
        pending = _Pending(info.shown, max_record_bytes, None if compressed else f)
        at_start = position == 0
        while stop < 0 or pos < stop:
            try:
                want = BLOCK if stop < 0 else min(BLOCK, stop - pos)
                # read1: a truncated compressed stream still yields what precedes the damage
                block = f.read1(want)  # type: ignore[attr-defined]
            except (EOFError, OSError, ValueError) as e:
                yield _truncated(info, seg, pos, line, e), pos, line
                return
            if not block:
                break
            if at_start and block.startswith(BOM):
                block, pos = block[len(BOM):], pos + len(BOM)
            at_start = False
            line_start = pos - pending.size  # where the pending line starts in the stream
            pos += len(block)
            lines = block.split(b"\n")
            tail = lines.pop()
            if lines:
                first = lines[0]
                offset = line_start + pending.size + len(first) + 1
                yield pending.finish(first, line, line_start), offset, line
                line += 1
                for ln in lines[1:]:
                    offset += len(ln) + 1
                    yield ln, offset, line
                    line += 1
            pending.add(tail)
        if pending.size:
            yield pending.finish(b"", line, pos - pending.size), pos, line


BOM = b"\xef\xbb\xbf"


class _Pending:
    """The part of a line read so far, held only while it is short.

    In a plain file (``f`` given) a line longer than one read block is not held: its bytes
    are only counted until its newline, then read again in one piece if it is within
    ``limit``; rejecting a 300 MB record costs one block of memory. In a compressed stream
    (no going back) the line is held up to the limit. One byte of slack: a CRLF line's
    ``\\r`` is not part of the record.
    """

    def __init__(self, path: str, limit: int, f: BinaryIO | None) -> None:
        self.path, self.limit, self.f = path, limit, f
        self.keep = min(BLOCK, limit + 1) if f is not None else limit + 1
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size <= self.keep:
            self.parts.append(data)
        else:
            self.parts = []

    def finish(self, last: bytes, line: int, start: int) -> bytes | InputError:
        """The whole line that began at ``start`` and ends with ``last``, or the error
        that it is longer than the limit."""
        self.add(last)
        size, parts = self.size, self.parts
        self.parts, self.size = [], 0
        if size > self.limit + 1:
            return too_large(self.path, line + 1, size, self.limit)
        if parts:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        assert self.f is not None  # parts are dropped only in a plain file
        here = self.f.tell()
        self.f.seek(start)
        data = self.f.read(size)
        self.f.seek(here)
        return data


def too_large(path: str, line_for_error: int, size: int, limit: int) -> InputError:
    return InputError(f"{path}:{line_for_error}: record of {size} bytes exceeds "
                      f"max_record_bytes={limit}", path=path, line=line_for_error,
                      reason="too_large")


def parse_line(raw: bytes, *, path: str, line_for_error: int,
               max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> dict[str, Any] | InputError:
    """One JSONL line → a dict, or the :class:`InputError` that names what is wrong."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    where = f"{path}:{line_for_error}"
    if not raw.strip():
        return InputError(f"{where}: empty line", path=path, line=line_for_error,
                          reason="empty_line")
    if len(raw) > max_record_bytes:
        return too_large(path, line_for_error, len(raw), max_record_bytes)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as u:
            return InputError(f"{where}: undecodable bytes (not UTF-8) at column "
                              f"{u.start + 1}", path=path, line=line_for_error,
                              reason="undecodable")
        return InputError(f"{where}: invalid JSON: {e}", path=path, line=line_for_error,
                          reason="invalid_json")
    if not isinstance(value, dict):
        return InputError(f"{where}: expected a JSON object, got {type(value).__name__}",
                          path=path, line=line_for_error, reason="not_object")
    return value


def iter_parquet(info: SourceInfo, seg: Segment, position: int, columns: list[str] | None,
                 storage_options: Options = None) -> Iterator[Located]:
    """Rows ``[position, seg.stop)`` of one row group, as dicts."""
    with parquet_input(info.path, storage_options, info.size) as pf:
        yield from _parquet_rows(pf, info, seg, position, columns)


def _parquet_rows(pf: Any, info: SourceInfo, seg: Segment, position: int,
                  columns: list[str] | None) -> Iterator[Located]:
    group = _row_group_of(pf, seg.start)
    row = seg.start
    selected = _select(info, seg, position, columns, pf.schema_arrow.names)
    if isinstance(selected, InputError):
        yield from _every_row(selected, seg, position)
        return
    for batch in pf.iter_batches(batch_size=4096, row_groups=[group], columns=selected):
        for rec in batch.to_pylist():
            if row >= position:
                yield Located(rec, row + 1, row - seg.start)
            row += 1


def iter_arrow_rows(info: SourceInfo, seg: Segment, position: int, columns: list[str] | None
                    ) -> Iterator[Located]:
    """Rows ``[position, seg.stop)`` of an Arrow IPC file, as dicts."""
    selected = _select(info, seg, position, columns, arrow_schema_names(info.path))
    if isinstance(selected, InputError):
        yield from _every_row(selected, seg, position)
        return
    for rec, row in iter_arrow(info.path, position, seg.stop, selected):
        yield Located(rec, row + 1, row - seg.start)


def _select(info: SourceInfo, seg: Segment, position: int, columns: list[str] | None,
            names: list[str]) -> list[str] | None | InputError:
    """The top-level columns holding ``columns`` (dotted keys reach into structs: see
    :mod:`~shardwise.sources.fields`), or the error that one is in no column."""
    if columns is None:
        return None
    selected, missing = top_columns(names, columns)
    if not missing:
        return selected
    kind = SourceFormat(info.format).name.capitalize()
    return InputError(f"{info.shown}: {kind} file has no column {missing[0]!r}; columns are "
                      f"{names}", path=info.shown, reason="missing_field")


def _every_row(err: InputError, seg: Segment, position: int) -> Iterator[Located]:
    for r in range(position, seg.stop):
        yield Located(err, r + 1, r - seg.start)


def _row_group_of(pf: Any, start_row: int) -> int:
    row = 0
    for g in range(pf.metadata.num_row_groups):
        if row == start_row:
            return g
        row += pf.metadata.row_group(g).num_rows
    return 0


def iter_records(info: SourceInfo, seg: Segment, position: int, line: int, *,
                 columns: list[str] | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 storage_options: Options = None) -> Iterator[Located]:
    """Every record of a segment from ``position``, parsed, with errors as values
    (``storage_options``: for a source in a bucket, see :mod:`.bucket`)."""
    fmt = SourceFormat(info.format)
    if fmt is SourceFormat.PARQUET:
        yield from iter_parquet(info, seg, position, columns, storage_options)
        return
    if fmt is SourceFormat.ARROW:
        yield from iter_arrow_rows(info, seg, position, columns)
        return
    for raw, end, ln in iter_lines(info, seg, position, line, max_record_bytes,
                                   storage_options):
        if isinstance(raw, InputError):
            yield Located(raw, end, ln)
            continue
        value = parse_line(raw, path=info.shown, line_for_error=ln + 1,
                           max_record_bytes=max_record_bytes)
        del raw  # a huge line's bytes go before its record is processed
        yield Located(value, end, ln)


def relocate(err: InputError, info: SourceInfo, seg_start: int, ln: int,
             storage_options: Options = None) -> InputError:
    """Rewrite an error's line number from segment-relative to file-absolute (called only
    when an error is raised: for JSONL it counts the newlines before the segment)."""
    if seg_start <= 0:
        return err
    path = info.shown  # as the message names it
    if SourceFormat(info.format).by_rows:
        abs_line = seg_start + ln + 1
    else:
        abs_line = absolute_line(info.path, seg_start, ln, storage_options)
    msg = str(err).replace(f"{path}:{ln + 1}:", f"{path}:{abs_line}:", 1)
    return InputError(msg, path=path, line=abs_line, reason=err.reason)
