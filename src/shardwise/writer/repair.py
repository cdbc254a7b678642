"""A rerun of a build repairs it: chunks an earlier run published are checked, and the
damaged ones are rebuilt from their source, with the same stems and bytes.

Why a chunk can be rebuilt alone: a worker cuts chunks by the chunk policy only, counting
from where the chunk starts, so starting a task where a damaged chunk started makes that
same chunk again. Where it started is the previous chunk's ``range.stop`` (from its
``.json``, trusted because the ledger's ``meta_xxh3`` matches it) or the segment's start,
so it is known even when the damaged chunk's own ``.json`` is the damaged file::

    segment 1:  c0 ok | c1 BAD (.json flipped) | c2 BAD (.bin missing) | c3 ok
    task:       start at c0.range.stop, line c0.range.line_stop; republish 2 chunks
                (stems 00001-00001, 00001-00002), then stop

The coordinator proves each result: the rebuilt ``.json`` must hash to the ``meta_xxh3``
the ledger recorded (it lists every data file's size and xxh3), or the build stops,
because the source has changed since.

Cost: ``CheckDepth.CHECKSUMS`` (the default) reads every byte of the existing chunks once,
streamed in blocks (constant memory), ``CHECK_THREADS`` chunks at a time; xxh3 runs at
memory speed, so the disk (or the network, for an object store, where each chunk is
downloaded to a temporary directory and deleted) sets the time. ``CheckDepth.SIZES``
reads only the small ``.json`` files and ``stat``s the rest: it finds missing, truncated
and grown files and damaged metadata, not flipped bits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import orjson

from shardwise.errors import CacheError, ManifestError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import META_SUFFIX, ChunkKind, ChunkMeta, chunk_stem
from shardwise.format.files import Root, read_file, where
from shardwise.format.ledger import LEDGER_NAME, Ledger, Segment
from shardwise.format.manifest import Manifest, SourceInfo
from shardwise.format.paths import safe_join
from shardwise.remote.client import RemoteStore
from shardwise.storage.chunk_check import (
    CheckDepth,
    ChunkExpect,
    check_chunk,
    check_remote_chunk,
)
from shardwise.storage.verify_report import Problem
from shardwise.writer.worker import Task

CHECK_THREADS = 4  # chunks checked at once: overlaps reads (hashing holds the GIL)
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True)
class Damage:
    """A chunk the ledger names whose files are not the ones published."""

    source: int
    segment: int
    index: int
    stem: str
    problems: tuple[Problem, ...]

    def reason(self, root: Root) -> str:
        """The first problem, its path relative to the cache (``.bin: xxh3_64 …``)."""
        first = self.problems[0]
        head = where(root, self.stem)
        path = first.path[len(head):] if first.path.startswith(head) else first.path
        return f"{path}: {first.what}"


def find_damaged(root: Root, ledger: Ledger, manifest: Manifest, depth: CheckDepth,
                 threads: int = CHECK_THREADS) -> tuple[list[Damage], int]:
    """Check every chunk the ledger names; the damaged ones and how many were checked."""
    expected = list(_expected(root, ledger, manifest))
    if isinstance(root, RemoteStore):
        def check(x: tuple[int, int, ChunkExpect]) -> list[Problem]:
            return check_remote_chunk(root, x[2], depth=depth).problems
    else:
        def check(x: tuple[int, int, ChunkExpect]) -> list[Problem]:
            return check_chunk(x[2], depth=depth).problems
    damaged = [Damage(e.source, g, k, e.entry.stem, tuple(found))
               for (g, k, e), found in zip(expected, _map_bounded(check, expected, threads),
                                           strict=True) if found]
    return damaged, len(expected)


def _expected(root: Root, ledger: Ledger, manifest: Manifest
              ) -> Iterator[tuple[int, int, ChunkExpect]]:
    """(segment, index, what the chunk must be) for every chunk; a ledger whose stems are
    not the canonical ones is refused (a rerun rebuilds chunks by position, so it cannot
    repair a damaged ledger)."""
    kind, dtype = ChunkKind(manifest.chunk_kind), np.dtype(manifest.dtype)
    ledger_at = where(root, LEDGER_NAME)
    for s, src in enumerate(ledger.sources):
        for g, seg in enumerate(src.segments):
            for k, entry in enumerate(seg.chunks):
                if entry.stem != chunk_stem(s, g, k):
                    raise ManifestError(
                        f"{ledger_at}: source {s} segment {g} chunk {k} is named "
                        f"{entry.stem!r}, expected {chunk_stem(s, g, k)!r}; the ledger is "
                        "damaged and a rerun cannot repair it: restore it from a copy, or "
                        "start again with --overwrite")
                if isinstance(root, Path):
                    safe_join(root, entry.stem, where=ledger_at)
                local = root if isinstance(root, Path) else Path()  # remote: downloaded
                yield g, k, ChunkExpect(local, s, entry, kind, dtype, segment=g, index=k)


def _map_bounded(fn: Callable[[_T], _R], items: Iterable[_T], threads: int) -> Iterator[_R]:
    """``map(fn, items)`` in ``threads`` threads, in order, at most ``2 * threads`` items
    in flight (memory stays constant however many chunks a cache has)."""
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="shardwise-check") as pool:
        pending: deque[Future[_R]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def repair_tasks(root: Root, ledger: Ledger, infos: list[SourceInfo],
                 damaged: list[Damage]) -> list[Task]:
    """One task per run of consecutive damaged chunks of a segment, starting where the
    run's first chunk started."""
    by_segment: dict[tuple[int, int], list[int]] = {}
    for d in damaged:
        by_segment.setdefault((d.source, d.segment), []).append(d.index)
    tasks = []
    for (s, g), indices in sorted(by_segment.items()):
        seg = ledger.sources[s].segments[g]
        for first, count in _runs(sorted(indices)):
            position, line = _start_of(root, seg, first)
            part = replace(seg, position=position, line=line, chunks=list(seg.chunks[:first]),
                           errors={}, finished=False)
            expect = tuple(c.meta_xxh3 for c in seg.chunks[first:first + count])
            tasks.append(Task(s, infos[s], g, part, rebuild=count, expect=expect))
    return tasks


def _runs(indices: list[int]) -> Iterator[tuple[int, int]]:
    """``[2, 3, 4, 7]`` → ``(2, 3), (7, 1)``: first index and length of each run."""
    start = prev = indices[0]
    for i in indices[1:]:
        if i != prev + 1:
            yield start, prev - start + 1
            start = i
        prev = i
    yield start, prev - start + 1


def _start_of(root: Root, seg: Segment, index: int) -> tuple[int, int]:
    """Position and line where chunk ``index`` of ``seg`` starts: the segment's start for
    the first chunk, else the end of the previous (intact) chunk."""
    if index == 0:
        return seg.start, 0
    prev = seg.chunks[index - 1]
    name = prev.stem + META_SUFFIX
    data = read_file(root, name)
    if bytes_checksum(data) != prev.meta_xxh3:  # it was checked moments ago
        raise CacheError(f"{where(root, name)} changed while the build was checking it; "
                         "is another process writing this cache?")
    rng = ChunkMeta.from_dict(orjson.loads(data)).range
    return rng.stop, rng.line_stop


__all__ = ["CHECK_THREADS", "Damage", "find_damaged", "repair_tasks"]
