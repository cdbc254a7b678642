"""The producer's side of a producer directory: how chunks are named, published and
declared, and the done markers that let a producer free the disk behind its readers.

Why its own module: this is the contract another program (in any language) keeps so that
:class:`~shardwise.read.external.producer_dir.ProducerDirDataset` can read it while it is
written; the reader and the Python helpers below share its one description
(:class:`Declared` parses ``_EXPECTED`` for both).

The producer's contract (any language):

1. Chunks are numbered ``0, 1, 2, …`` and named by ``pattern`` (``chunk_00000.jsonl``).
   Each holds one JSON object per line.
2. A chunk is written under a temporary name that does not match the pattern (e.g.
   ``.tmp-chunk_00007.jsonl``), flushed and fsynced, then renamed to its final name. A
   published chunk is complete and never changes.
3. Totals are declared in ``_EXPECTED``, written atomically the same way, as early as they
   are known: ``{"num_chunks": 40, "records_per_chunk": 512}`` or with exact per-chunk
   counts ``{"num_chunks": 3, "records": [512, 512, 97]}``. ``num_chunks`` alone also
   marks where the data ends. (Or pass ``num_chunks`` / ``records_per_chunk`` to the
   reader.)
4. Optionally, the producer deletes a chunk once :func:`finished_by_all` says its reader
   wrote its done marker ``chunk_00007.jsonl.done.<rank>``.

A Python producer (ten lines)::

    import time
    from shardwise.read.external.producer_dir import delete_finished, publish_chunk, write_expected

    write_expected(out, num_chunks=40, records_per_chunk=512)
    for c in range(40):
        publish_chunk(out, c, [make_sample(c, j) for j in range(512)])  # temp + rename
        delete_finished(out, world_size=8)        # free the disk behind the readers
    while list(out.glob("chunk_*.jsonl")):       # until every reader is done
        delete_finished(out, world_size=8)
        time.sleep(5)
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError
from shardwise.format.atomic import atomic_write_bytes
from shardwise.read.external.producer_dir.names import DEFAULT_PATTERN, ChunkNames

EXPECTED = "_EXPECTED"
DEFAULT_MARKER = ".done.{rank}"  # appended to a chunk's name; ".completed" for ms-swift


Pattern = str | re.Pattern[str]


def _path(directory: str | os.PathLike[str], pattern: Pattern, index: int) -> Path:
    name = ChunkNames(pattern).name(directory, index)
    if name is None:
        raise ConfigError(f"{directory}: no file of chunk {index} matches {pattern!r}; a "
                          "producer helper needs a format pattern such as "
                          f"{DEFAULT_PATTERN!r} to name a chunk that does not exist yet")
    return Path(directory) / name


def done_marker(directory: str | os.PathLike[str], index: int, rank: int,
                pattern: Pattern = DEFAULT_PATTERN, marker: str = DEFAULT_MARKER) -> Path:
    """``chunk_NNNNN.jsonl.done.<rank>``: written by ``rank`` when it finished the chunk."""
    p = _path(directory, pattern, index)
    return p.with_name(p.name + marker.format(rank=rank))


def finished_by_all(directory: str | os.PathLike[str], index: int, world_size: int,
                    pattern: Pattern = DEFAULT_PATTERN, marker: str = DEFAULT_MARKER) -> bool:
    """True once every reader of chunk ``index`` (rank ``index % world_size``) is done."""
    return done_marker(directory, index, index % world_size, pattern, marker).exists()


def chunk_indices(directory: str | os.PathLike[str], pattern: Pattern = DEFAULT_PATTERN
                  ) -> list[int]:
    """The indices of the chunks published in ``directory`` now, ascending."""
    return ChunkNames(pattern).indices(directory)


def delete_finished(directory: str | os.PathLike[str], world_size: int,
                    pattern: Pattern = DEFAULT_PATTERN, marker: str = DEFAULT_MARKER
                    ) -> list[int]:
    """Delete every published chunk its reader has finished, and its done marker; returns
    the indices deleted. For the producer side."""
    deleted, names = [], ChunkNames(pattern)
    for index in names.indices(directory):
        chunk = Path(directory) / str(names.name(directory, index))
        done = chunk.with_name(chunk.name + marker.format(rank=index % world_size))
        if done.exists():
            chunk.unlink(missing_ok=True)
            done.unlink(missing_ok=True)
            deleted.append(index)
    return deleted


def write_expected(directory: str | os.PathLike[str], *, num_chunks: int,
                   records_per_chunk: int | None = None,
                   records: Sequence[int] | None = None) -> None:
    """Declare the totals (atomically); see the module docstring."""
    body: dict[str, Any] = {"num_chunks": num_chunks}
    if records_per_chunk is not None:
        body["records_per_chunk"] = records_per_chunk
    if records is not None:
        body["records"] = list(records)
    Declared.parse(body, Path(directory) / EXPECTED)
    atomic_write_bytes(Path(directory) / EXPECTED, orjson.dumps(body))


def publish_chunk(directory: str | os.PathLike[str], index: int, records: Sequence[Any],
                  pattern: Pattern = DEFAULT_PATTERN) -> Path:
    """Write one chunk under a temporary name, fsync, rename (for Python producers)."""
    path = _path(directory, pattern, index)
    atomic_write_bytes(path, b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def _count(value: Any, name: str, low: int) -> int:
    return as_count(value, name, minimum=low, error=ConfigError)


@dataclass(frozen=True)
class Declared:
    """The producer's totals; ``None`` where not (yet) declared."""

    num_chunks: int | None = None
    records_per_chunk: int | None = None
    records: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, body: Any, where: Path | str) -> Declared:
        if not isinstance(body, dict) or "num_chunks" not in body:
            raise ConfigError(f"{where}: expected a JSON object with num_chunks and "
                              f"records_per_chunk or records, got {body!r}")
        n = _count(body["num_chunks"], f"{where}: num_chunks", 0)
        k = body.get("records_per_chunk")
        recs = body.get("records")
        if recs is not None:
            if not isinstance(recs, list) or len(recs) != n:
                raise ConfigError(f"{where}: records must list {n} counts (one per chunk)")
            recs = tuple(_count(v, f"{where}: records[i]", 0) for v in recs)
        return cls(n, None if k is None else _count(k, f"{where}: records_per_chunk", 1),
                   recs)

    @classmethod
    def given(cls, num_chunks: int | None, records_per_chunk: int | None) -> Declared:
        """The totals passed to the reader (checked like those of ``_EXPECTED``)."""
        return cls(None if num_chunks is None else _count(num_chunks, "num_chunks", 0),
                   None if records_per_chunk is None
                   else _count(records_per_chunk, "records_per_chunk", 1))

    def merge(self, other: Declared, where: str) -> Declared:
        for name in ("num_chunks", "records_per_chunk", "records"):
            a, b = getattr(self, name), getattr(other, name)
            if a is not None and b is not None and a != b:
                raise ConfigError(f"{name}={a!r} was passed to the reader but {where} "
                                  f"declares {b!r}; remove the argument or fix {where}")
        return Declared(*(getattr(self, n) if getattr(self, n) is not None
                          else getattr(other, n)
                          for n in ("num_chunks", "records_per_chunk", "records")))

    def count(self, index: int) -> int | None:
        return self.records[index] if self.records is not None else self.records_per_chunk

    @property
    def sized(self) -> bool:
        return self.num_chunks is not None and (self.records is not None
                                                or self.records_per_chunk is not None)


@dataclass(frozen=True)
class Chunk:
    index: int
    path: str
    records: list[Any]


class EndOfData(Exception):
    """Internal: the chunk asked for is past the declared ``num_chunks``."""


__all__ = ["DEFAULT_MARKER", "EXPECTED", "Chunk", "Declared", "EndOfData", "Pattern",
           "chunk_indices", "delete_finished", "done_marker", "finished_by_all",
           "publish_chunk", "write_expected"]
