"""Arrow IPC files: the files Hugging Face ``datasets`` keeps its rows in.

``datasets`` writes the Arrow *stream* format (``save_to_disk``'s ``data-*.arrow``, the
cache files of ``load_dataset`` and ``map``); the Arrow *file* format (with a footer) is
read too. A file is memory-mapped, so counting its rows or skipping to a row reads only
record-batch headers, never column data. A record's position is its row in the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SLICE_ROWS = 4096
"""Rows turned into Python objects at once (Parquet's reader reads 4096 at a time too)."""


def arrow_batches(path: str, columns: list[str] | None = None) -> Iterator[Any]:
    """The record batches of one Arrow IPC file (stream or file format), in order;
    ``columns``: only these (top-level) columns."""
    import pyarrow as pa

    with pa.memory_map(path, "r") as source:
        try:
            reader = pa.ipc.open_stream(source)  # the format datasets writes
        except pa.ArrowInvalid:
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            batches: Iterator[Any] = (file_reader.get_batch(i)
                                      for i in range(file_reader.num_record_batches))
        else:
            batches = iter(reader)
        for batch in batches:
            yield batch if columns is None else batch.select(columns)


def arrow_schema_names(path: str) -> list[str]:
    import pyarrow as pa

    with pa.memory_map(path, "r") as source:
        try:
            return list(pa.ipc.open_stream(source).schema.names)
        except pa.ArrowInvalid:
            source.seek(0)
            return list(pa.ipc.open_file(source).schema.names)


def arrow_rows(path: str) -> int:
    """The number of rows of an Arrow IPC file (batch headers only)."""
    return sum(batch.num_rows for batch in arrow_batches(path, columns=[]))


def iter_arrow(path: str, position: int, stop: int = -1, columns: list[str] | None = None
               ) -> Iterator[tuple[dict[str, Any], int]]:
    """``(record, row)`` for rows ``[position, stop)`` (``stop = -1``: to the end);
    whole batches before ``position`` are skipped by their row counts."""
    row = 0
    for batch in arrow_batches(path, columns):
        n = batch.num_rows
        if row + n <= position:
            row += n
            continue
        if 0 <= stop <= row:
            return
        at = max(0, position - row)
        end = n if stop < 0 else min(n, stop - row)
        while at < end:  # a few thousand rows at a time: one batch may hold a whole file
            for rec in batch.slice(at, min(SLICE_ROWS, end - at)).to_pylist():
                yield rec, row + at
                at += 1
        row += n
