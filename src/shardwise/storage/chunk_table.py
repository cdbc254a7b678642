"""A cache's visible chunks as columns, so that opening costs O(1) Python per chunk.

Why: a cache of 100,000 chunks opened by every rank must not build 100,000 objects or
resolve 100,000 paths before its first example (that took seconds). The ledger's view
(:class:`~shardwise.format.ledger_index.LedgerView`, read from ``ledger.index``) already
holds numpy columns; :class:`ChunkTable` keeps them and makes a :class:`ChunkInfo` only
for the chunk asked for. Stems are checked on arrival in one pass over their bytes (a
relative path inside the cache); that a chunk's *files* do not resolve outside the cache
through a symlink is checked when each file is first used
(:meth:`shardwise.storage.local.LocalStore.with_file`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from shardwise.format.chunk import ChunkKind
from shardwise.format.ledger_index import ChunkColumns
from shardwise.format.paths import CONTROL, safe_join

_CONTROL = re.compile(CONTROL.pattern.encode())


@dataclass(frozen=True)
class ChunkInfo:
    """A visible chunk: where its files are (``base`` + suffix) and what it holds."""

    stem: str
    base: Path
    kind: ChunkKind
    source: int
    documents: int
    tokens: int
    meta_xxh3: str = ""


class ChunkTable(Sequence[ChunkInfo]):
    """The visible chunks of a cache under ``root``, all of one ``kind``, in global order.

    ``table[i]`` makes chunk ``i``'s :class:`ChunkInfo`; ``columns`` are the numpy
    columns (``documents``, ``tokens``, …) for vectorised use."""

    def __init__(self, root: Path, kind: ChunkKind, columns: ChunkColumns, *,
                 where: str) -> None:
        check_stems(root, columns.stem, where=where)
        self.root, self.kind, self.columns = root, kind, columns

    @classmethod
    def of(cls, root: Path, chunks: Sequence[ChunkInfo], *, where: str) -> ChunkTable:
        """A table of given chunks (a Megatron prefix, a document range); every chunk's
        ``base`` must be ``root / stem``."""
        kinds = {c.kind for c in chunks}
        if len(kinds) > 1 or any(c.base != root / c.stem for c in chunks):
            raise ValueError(f"{where}: chunks of one table share one kind and root")
        columns = ChunkColumns.from_order([(c.source, c) for c in chunks])  # type: ignore[misc]
        return cls(root, kinds.pop() if kinds else ChunkKind.TOKENS, columns, where=where)

    def __len__(self) -> int:
        return len(self.columns)

    @overload
    def __getitem__(self, i: int) -> ChunkInfo: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ChunkInfo]: ...

    def __getitem__(self, i: int | slice) -> ChunkInfo | Sequence[ChunkInfo]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        c = self.columns
        stem = c.stem[i].decode()
        return ChunkInfo(stem, self.root / stem, self.kind, int(c.source[i]),
                         int(c.documents[i]), int(c.tokens[i]), c.meta_xxh3[i].decode())

    def __iter__(self) -> Iterator[ChunkInfo]:
        return (self[i] for i in range(len(self)))

    def extend(self, more: ChunkColumns, *, where: str) -> None:
        """Append newly visible chunks."""
        check_stems(self.root, more.stem, where=where)
        self.columns = self.columns.concat(more)

    def same_prefix(self, other: ChunkColumns) -> int:
        """-1 if ``other`` starts with this table's stems, else the first that differs."""
        n = len(self)
        if len(other) >= n and np.array_equal(self.columns.stem, other.stem[:n]):
            return -1
        head = other.stem[:n]
        differ = np.flatnonzero(self.columns.stem[:len(head)] != head)
        return int(differ[0]) if len(differ) else len(head)


class View(Protocol):
    """What a store reads a cache's chunks by: the ledger's view of them (a
    :class:`~shardwise.storage.cache.Cache`)."""

    chunks: ChunkTable
    cum_tokens: npt.NDArray[np.int64]
    dtype: np.dtype
    vocab_size: int | None
    verify: bool
    fingerprint: str

    @property
    def is_megatron(self) -> bool: ...

    @property
    def location(self) -> str: ...


def check_stems(root: Path, stems: npt.NDArray[np.bytes_], *, where: str) -> None:
    """Every stem is a relative path inside the cache. One scan of the joined bytes looks
    for what could be wrong (an absolute path, ``..``, a backslash, an empty stem, a
    control character); only
    if it finds some is each stem checked by :func:`~shardwise.format.paths.safe_join`,
    which names the culprit."""
    if not len(stems):
        return
    listed = stems.tolist()
    joined = b"/" + b"/\n/".join(listed) + b"/"
    if (any(bad in joined for bad in (b"//", b"/../", b"\\"))
            or _CONTROL.search(b"".join(listed))):
        for stem in listed:
            safe_join(root, stem.decode(errors="replace"), where=where)
