"""How a :class:`~shardwise.storage.bucket.BucketStore` reads a batch whose chunks are still
arriving: ranged GETs of just its runs (:mod:`shardwise.storage.ranged`), started early
when the reader hands the coming batch's runs over (:meth:`RangedGather.prefetch_runs`),
else when the batch is read, each block checked against the chunk's block sums.

Why a module of its own: the rest of the store is about whole files (downloads, the
node-local copy, the look-ahead); this is about a batch's bytes before its files land.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import CorruptChunkError
from shardwise.format.checksum import BLOCK_BYTES
from shardwise.format.chunk import META_SUFFIX
from shardwise.remote.client import RemoteStore
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.prefetch import SMALL_BATCH, Prefetcher
from shardwise.storage.ranged import Arriving, BlockSums, EarlyReads, Fetched
from shardwise.storage.runs import Mapped, Runs, gather_runs
from shardwise.storage.store import ChunkStore


class RangedGather(ChunkStore):
    """The batch reads of a store whose chunks arrive from an object store (the part of
    :class:`~shardwise.storage.bucket.BucketStore` that reads before files land)."""

    remote: RemoteStore

    def _prefetcher(self) -> Prefetcher:
        raise NotImplementedError

    @property
    def _early(self) -> EarlyReads:  # this process's (BucketStore's)
        raise NotImplementedError

    @property
    def _arriving(self) -> Arriving:
        raise NotImplementedError

    def _on_node(self, c: int) -> bool:
        raise NotImplementedError

    def _fetch(self, info: ChunkInfo, suffix: str, until: float | None = None) -> Path:
        raise NotImplementedError

    def prefetch(self, chunks: Iterable[int]) -> bool:
        raise NotImplementedError

    def gather(self, runs: Any) -> npt.NDArray[Any]:
        """From the local copy of each chunk that is here; the runs of chunks still
        arriving by ranged GETs — started early where the reader handed the runs over
        (:meth:`prefetch_runs`), and now for those the early read did not cover (a chunk
        that seemed to be landing then) — checked by the chunks' block sums
        (:mod:`shardwise.storage.ranged`), while the whole chunks keep downloading.
        Every batch comes this way: once every chunk is mapped, straight to the maps."""
        if not self.prefetches:
            return super().gather(runs)
        self._arriving.asked()
        try:
            return self._gather(Runs.of(runs))
        finally:
            self._arriving.handed()

    def _gather(self, runs: Runs) -> npt.NDArray[Any]:
        view = self.view
        runs.check(view.chunks.columns.tokens, view.location)
        early = self._early.take(EarlyReads.key(*runs), self._arriving.own_s)
        parts = [early.result()] if early is not None else []  # its errors: this batch's
        covered = {c for _, usable, _ in parts for c in usable}
        plan = self._plan(runs, skip=covered)
        if plan is not None:
            self._hand_over(plan[0])
            parts.append(self._read_ranged(runs, *plan))
        pieces: dict[int, npt.NDArray[Any]] = {}  # row of runs → its tokens
        size, chunks = view.dtype.itemsize, view.chunks
        for rows, usable, fetched in parts:
            if fetched is None:
                continue  # no chunk of them has block sums to check by: read whole
            for r in rows[np.isin(runs.chunk[rows], usable)].tolist():
                o, n = int(runs.offset[r]) * size, int(runs.length[r]) * size
                pieces[r] = fetched.tokens(chunks[int(runs.chunk[r])].stem, o, o + n, view.dtype)
        if not pieces:
            return super().gather(runs)  # here, or landing sooner than ranged GETs
        self._arriving.reads += len(pieces)
        rows = np.fromiter(pieces, dtype=np.int64, count=len(pieces))
        chunk, offset = runs.chunk.copy(), runs.offset.copy()
        chunk[rows], offset[rows] = -1 - rows, 0  # row r: pieces[r]
        out = gather_runs(lambda c: Mapped(pieces[-1 - c]) if c < 0 else self._mapped(c),
                          Runs(chunk, offset, runs.length), view.dtype)
        self._checks().batch_ids(out, runs)
        return out

    def _plan(self, runs: Runs, early: bool = False, skip: set[int] | frozenset[int] = frozenset()
              ) -> tuple[list[int], npt.NDArray[np.int64]] | None:
        """The chunks of ``runs`` to read by ranged GETs and the rows of ``runs`` in them;
        None: read from the local copy. Only chunks downloading, or never handed over
        here (:meth:`Prefetcher.eta`: a DataLoader worker's, whose loader's process hands
        them over for the node; its first batch waited 1.5–2 s for whole chunks), are read
        by ranged GETs: one queued for room is downloaded by the chunk's own read, and
        a download that ended without landing failed, so the chunk's own read raises its
        error; and, read now, none where every one is expected to land within two round
        trips (``early``, a coming batch's: whenever one is away and may land after the
        reader gets to the batch — the expected landing is an estimate, so twice it);
        none while ranged reads cannot keep up with the reader
        (:meth:`~shardwise.storage.ranged.Arriving.serves`: it waits for the downloads,
        which then have the link to themselves). ``skip``: chunks whose runs are read
        already."""
        if not self._arriving.serves():
            self._arriving.skipped += 1
            return None
        some, ahead, chunks = runs.length > 0, self._prefetcher(), self.view.chunks
        etas = {c: ahead.eta(chunks[c].stem + ".bin")
                for c in np.unique(runs.chunk[some]).tolist()
                if c not in skip and not self._on_node(c)}
        away = [c for c, eta in etas.items() if eta]
        if early:
            due = self._early.due_s()
            late = due is None or any(2 * etas[c] > due for c in away)  # type: ignore[operator]
        else:
            late = self._arriving.worth([etas[c] for c in away])  # type: ignore[misc]
        if not away or not late:
            return None
        return away, np.flatnonzero(some & np.isin(runs.chunk, away))

    def _read_ranged(self, runs: Runs, away: list[int], rows: npt.NDArray[np.int64]
                     ) -> tuple[npt.NDArray[np.int64], list[int], Fetched | None]:
        return (rows, *self._ranged(away, rows, runs))

    def _ranged(self, away: list[int], rows: npt.NDArray[np.int64], runs: Runs
                ) -> tuple[list[int], Fetched | None]:
        """Ranged GETs of ``runs[rows]`` (runs in chunks ``away``), checked: the chunks
        whose bytes may be used (the others' are read whole) and the bytes (None: none
        was asked for). When verifying, the whole 64 KiB blocks around each run are
        asked for while the chunks' metadata (their block sums) is read, on a thread,
        in the same round trip; once this process holds the metadata, only chunks
        with block sums are asked for."""
        view, size = self.view, self.view.dtype.itemsize
        infos = {c: view.chunks[c] for c in away}
        sums_of: ReadAhead[dict[int, BlockSums]] | None = None
        if not view.verify:
            sums: dict[int, BlockSums | None] = dict.fromkeys(away)
        elif all(i.stem in self._metas for i in infos.values()):
            sums = dict(self._block_sums(away))  # no request
            rows = rows[np.isin(runs.chunk[rows], list(sums))]
            if not len(rows):
                return [], None
        else:
            sums_of = ReadAhead.call(self._block_sums, away, name="shardwise-block-sums")
        try:
            fetched = self._arriving.fetch(
                self.remote, [(infos[c].stem, o * size, (o + n) * size) for c, o, n in zip(
                    runs.chunk[rows].tolist(), runs.offset[rows].tolist(),
                    runs.length[rows].tolist(), strict=True)],
                {i.stem: i.tokens * size for i in infos.values()},
                BLOCK_BYTES if view.verify else 0)
            if sums_of is not None:
                sums = dict(sums_of.get())
        finally:
            if sums_of is not None:
                sums_of.close(None)
        usable = fetched.check({infos[c].stem: s for c, s in sums.items()})
        return [c for c in away if infos[c].stem in usable], fetched

    def _block_sums(self, chunks: list[int]) -> dict[int, BlockSums]:
        """The block sums of each of ``chunks`` that has them (an older build's chunk has
        none: it is read whole), from their metadata (what this process lacks read in
        one round trip, checked against the ledger; in a cache of at most
        :data:`~shardwise.storage.prefetch.SMALL_BATCH` chunks, every chunk's at once:
        the early reads of the first batches, a few of them at once, each wanted other
        chunks' and waited one round trip more for them, behind this lock)."""
        infos = [self.view.chunks[c] for c in chunks]
        with self._early.meta_lock:  # early reads of several batches: one fetch
            missing = [i for i in infos if i.stem not in self._metas]
            others = self._other_metas(missing) if missing else []
            # checked: each against the ledger (so through the GIL-free client)
            got = self.remote.get_many([i.stem + META_SUFFIX for i in missing + others],
                                       checked=True) if missing else {}
            for info in missing:
                self._load_meta(info, got[info.stem + META_SUFFIX])
            for info in others:  # not asked for: a fault surfaces when the chunk is read
                data = got[info.stem + META_SUFFIX]
                if not isinstance(data, Exception):
                    with contextlib.suppress(CorruptChunkError):
                        self._load_meta(info, data)
        sums = {c: BlockSums.of(self.meta_of(i)) for c, i in zip(chunks, infos, strict=True)}
        return {c: s for c, s in sums.items() if s is not None}

    def _other_metas(self, asked: list[ChunkInfo]) -> list[ChunkInfo]:
        """The chunks besides ``asked`` whose metadata comes in the same round trip: in a
        cache of at most ``SMALL_BATCH`` chunks, every one this process lacks."""
        chunks = self.view.chunks
        if len(chunks) > SMALL_BATCH:
            return []
        stems = {i.stem for i in asked}
        return [i for i in (chunks[c] for c in range(len(chunks)))
                if i.stem not in stems and i.stem not in self._metas]

    def _hand_over(self, chunks: list[int]) -> None:
        """Make sure the whole of ``chunks`` is downloading (or queued to)."""
        ahead, size = self._prefetcher(), self.view.dtype.itemsize
        for c in chunks:
            info = self.view.chunks[c]
            ahead.add(info.stem + ".bin", info.tokens * size, partial(self._fetch, info, ".bin"))

    def reader_pace(self, own_s: float | None) -> None:
        self._arriving.paced(own_s)

    def ready_for_workers(self) -> None:
        self.remote.ready_to_fork()

    def prefetch_runs(self, runs: Any) -> bool:
        """:meth:`prefetch` of the chunks of ``runs`` (a coming batch's, in order), and,
        while they arrive, the batch's ranged GETs started now (:class:`EarlyReads`): the
        reader is asked for more batches while fewer than ``DEPTH`` are read ahead."""
        runs = Runs.of(runs[:3])  # an order's runs carry more columns
        more = self.prefetch(list(dict.fromkeys(runs.chunk[runs.length > 0].tolist())))
        return self.read_early(runs) or more

    def read_early(self, runs: Any) -> bool:
        """The ranged GETs of a coming batch (its runs), started now where its chunks may
        land after the reader gets to it (:class:`EarlyReads`), the chunks not handed over
        here: :meth:`prefetch_runs`' second half, and all a DataLoader worker does with
        its coming batches (its loader's process downloads their chunks for the node).
        Returns whether the reader may hand over more (fewer than ``depth`` read ahead)."""
        runs = Runs.of(runs[:3])
        plan = self._plan(runs, early=True)
        if plan is None:
            return False
        self._early.start(EarlyReads.key(*runs), partial(self._read_ranged, runs, *plan))
        return self._early.wants_more()


__all__ = ["RangedGather"]
