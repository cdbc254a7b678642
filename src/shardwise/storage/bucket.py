"""A cache on an object store: a prefix reached through
:class:`~shardwise.remote.client.RemoteStore`, read through a node-local, byte-bounded
copy.

Writes are whole objects, one PUT each, in the order the format gives (a chunk's data
files, at once, then its metadata; the ledger last; a build uploads a chunk while it makes
the next one: :mod:`shardwise.writer.publishing`).

Reads: a chunk file is downloaded on first use into the node's
:class:`~shardwise.storage.download.DownloadDir` (shared by the node's processes, bounded
by ``local_bytes``), checked as it streams against the chunk's metadata (size, xxh3; the
metadata against the ledger) and then memory-mapped like a local file; downloads ahead
follow the measured pace (:mod:`shardwise.storage.prefetch`), and a ``.bin`` comes with
its metadata in one round trip (:mod:`shardwise.storage.chunk_fetch`).
A missing or damaged object is a :class:`CorruptChunkError` naming its URL.

A batch whose chunks are still arriving is read by ranged GETs of just its runs
(:meth:`BucketStore.gather`, :mod:`shardwise.storage.ranged`) while the whole chunks
download ahead; GETs go through a client without the GIL where one is installed
(:mod:`shardwise.remote.native`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import CacheError
from shardwise.format.checksum import BLOCK_BYTES
from shardwise.format.chunk import META_SUFFIX
from shardwise.format.files import Payload
from shardwise.remote.client import RemoteStore
from shardwise.storage import chunk_fetch
from shardwise.storage.chunk_check import CheckDepth, ChunkExpect, check_remote_chunk
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.download import GROUP, DownloadDir
from shardwise.storage.heads import NodeHeads
from shardwise.storage.owned import clear_keys, is_owned
from shardwise.storage.prefetch import Prefetcher
from shardwise.storage.ranged import Arriving, BlockSums, EarlyReads, Fetched
from shardwise.storage.runs import Runs, gather_runs
from shardwise.storage.store import ChunkStore
from shardwise.storage.verify_report import VerifyReport

_T = TypeVar("_T")


def _read_or_error(read: Callable[[str], bytes], name: str) -> bytes | Exception:
    try:
        return read(name)
    except FileNotFoundError as e:
        return e


class BucketStore(ChunkStore):
    """The :class:`~shardwise.storage.store.ChunkStore` of a prefix on an object store;
    ``downloads``: the node-local copy chunks are read through (None: for writing only);
    ``heads``: where the manifest, ledger and index are read (this node's snapshot of
    them, :mod:`shardwise.storage.heads`; None: from the store, as a build does)."""


    def __init__(self, remote: RemoteStore, downloads: DownloadDir | None = None, *,
                 heads: NodeHeads | None = None) -> None:
        super().__init__()
        self.remote, self.downloads, self.heads = remote, downloads, heads
        self._ahead: Prefetcher | None = None  # downloads ahead
        # the levers of issue 21 (on; ``bench remote`` switches them off to measure them):
        self.ranged = True  # a batch's runs by ranged GETs while their chunk is arriving
        self.paced_budget = True  # the look-ahead's bytes sized by the pace, not a half
        self.group = GROUP  # a chunk file's blocks asked for at once
        self._arriving = Arriving()
        self._early = EarlyReads()  # ranged reads of coming batches, started ahead
        self._here: set[int] = set()  # chunks on the node for good (see _on_node)
        self._here_stems: set[str] = set()  # their stems
        self._fit = (-1, False)  # (chunks of the view, all their files fit on the node)

    def __repr__(self) -> str:
        return f"BucketStore({self.remote.url!r})"

    # -- files -----------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return self.remote.url

    @property
    def root(self) -> Path:  # type: ignore[override]
        return self._downloads().dir

    def name(self, relative: str) -> str:
        return self.remote.url_of(relative)

    def read(self, relative: str) -> bytes:
        if self.heads is not None and self.heads.is_head(relative):
            return self.heads.read(relative)
        return self.remote.get(relative)

    def write(self, relative: str, data: Payload) -> None:
        self.remote.put(relative, data)

    publishes_ahead = True  # a build uploads a chunk while it makes the next one

    def publish(self, stem: str, payloads: dict[str, Payload]) -> None:
        """One whole-object PUT each: the data files at once (the first on this thread,
        the others on the store's threads), then, once every one is in, the metadata."""
        *data, (meta_suffix, meta) = payloads.items()
        others = [self.submit(partial(self.remote.put, stem + suffix, body))
                  for suffix, body in data[1:]]
        try:
            if data:
                self.remote.put(stem + data[0][0], data[0][1])
        finally:  # every PUT has ended before this returns or raises
            failed = [e for e in (f.exception() for f in others) if e is not None]
        if failed:
            raise failed[0]
        self.remote.put(stem + meta_suffix, meta)

    def exists(self, relative: str) -> bool:
        return self.remote.exists(relative)

    def keys(self) -> list[str]:
        return self.remote.list_keys()

    def remove(self, relatives: list[str]) -> None:
        self.remote.remove(relatives)

    def read_fresh(self, relative: str) -> bytes:
        return self.remote.get(relative)

    def read_many(self, relatives: list[str]) -> list[bytes | Exception]:
        if self.heads is not None and all(self.heads.is_head(r) for r in relatives):
            return [_read_or_error(self.heads.read, r) for r in relatives]
        got = self.remote.get_many(relatives) if relatives else {}
        return [got[r] for r in relatives]

    def list_dir(self, relative: str) -> list[str]:
        if self.heads is not None and self.heads.is_head(relative + "/"):
            return self.heads.list_dir(relative)  # the node's listing, not one per rank
        return self.remote.list_dir(relative)

    def stamp(self, relative: str) -> tuple[object, ...]:
        if self.heads is not None and self.heads.is_head(relative):
            return self.heads.stamp(relative)
        return self.remote.stamp(relative)

    # -- a build -------------------------------------------------------------------------
    def clear(self) -> int:
        return clear_keys(self)

    def entries(self) -> list[str]:
        return self.keys()

    def foreign(self) -> list[str]:
        return [k for k in self.keys() if not is_owned(k)]

    def check_published(self, exp: ChunkExpect, depth: CheckDepth) -> VerifyReport:
        return check_remote_chunk(self.remote, exp, depth=depth)

    # -- chunks ------------------------------------------------------------------------------
    def _downloads(self) -> DownloadDir:
        if self.downloads is None:
            raise CacheError(f"{self.location}: opened for writing, without a local "
                             "directory to read chunks through; read it with open_cache")
        return self.downloads

    def with_file(self, info: ChunkInfo, suffix: str, use: Callable[[Path], _T]) -> _T:
        """``use`` of the chunk file's local copy; retried if another process evicted the
        copy before ``use`` opened it."""
        for attempt in range(3):
            try:
                return use(self._download(info, suffix))
            except FileNotFoundError:
                # evicted after all (a process of the node with a smaller local_bytes):
                # forget what was thought to stay, and download it
                self._here.clear()
                self._here_stems.clear()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _download(self, info: ChunkInfo, suffix: str) -> Path:
        """The local copy of a chunk file: a prefetched one if its download succeeded; a
        ``.bin`` on the node for good (:meth:`_on_node`) at once, as a local cache's."""
        if suffix == ".bin" and info.stem in self._here_stems and self._all_fit():
            return self._downloads().dir / (info.stem + suffix)
        return self._prefetcher().take(info.stem + suffix, partial(self._fetch, info, suffix),
                                       new_chunk=suffix == ".bin")

    def _fetch(self, info: ChunkInfo, suffix: str, until: float | None = None) -> Path:
        """Download (or find on this node) one chunk file, pinned ``until`` if given (a
        download ahead of the reader); a ``.bin`` whose metadata this process does not
        hold yet comes with it in one round trip."""
        downloads = self._downloads()
        if suffix == ".bin" and info.tokens and info.stem not in self._metas:
            size = info.tokens * self.view.dtype.itemsize
            return chunk_fetch.fetch_bin_with_meta(self.remote, downloads, info, size,
                                                   partial(self._load_meta, info), until,
                                                   self.group)
        return chunk_fetch.fetch_checked(self.remote, downloads, info, suffix,
                                         self.meta_of(info), until, self.group)

    def _meta_bytes(self, info: ChunkInfo) -> bytes | Exception:
        """With those of the chunks ahead, in one round trip."""
        try:
            return self._prefetcher().small(info.stem + META_SUFFIX, self.remote.get_many)
        except FileNotFoundError as e:
            return e

    def bin_size(self, info: ChunkInfo) -> int:
        """From the metadata: the ``.bin`` may not be here yet."""
        return int(self.meta_of(info).files.get(".bin", {}).get("bytes", -1))

    def here(self, chunks: Iterable[int]) -> bool:
        return not self.ranged or all(self._on_node(c) for c in chunks)

    def _on_node(self, c: int) -> bool:
        """Chunk ``c`` is mapped, or its checked copy is on this node (remembered where
        nothing is ever evicted, :meth:`_all_fit`: no stat per chunk and batch)."""
        if c in self._maps or c in self._here:
            return True
        here = os.path.exists(self._downloads().dir / (self.view.chunks[c].stem + ".bin"))
        if here and self._all_fit():
            self._here.add(c)
            self._here_stems.add(self.view.chunks[c].stem)
        return here

    def _all_fit(self) -> bool:
        """Whether every chunk file of the view fits in the node's local copy at once (the
        ``.idx`` and metadata sizes overestimated), so that none is ever evicted and a
        file seen on the node stays there. Checked again when the view grows."""
        n = len(self.view.chunks)
        if self._fit[0] != n:
            cols = self.view.chunks.columns
            need = (int(cols.tokens.sum()) * self.view.dtype.itemsize
                    + 24 * int(cols.documents.sum()) + (64 << 10) * n)
            self._fit = n, need <= self._downloads().max_bytes
            if not self._fit[1]:
                self._here.clear()
                self._here_stems.clear()
        return self._fit[1]

    def gather(self, runs: Any) -> npt.NDArray[Any]:
        """From the local copy of each chunk that is here; the runs of chunks still
        arriving by ranged GETs — started early where the reader handed the runs over
        (:meth:`prefetch_runs`), and now for those the early read did not cover (a chunk
        that seemed to be landing then) — checked by the chunks' block sums
        (:mod:`shardwise.storage.ranged`), while the whole chunks keep downloading."""
        if not self.ranged:
            return super().gather(runs)
        runs, view = Runs.of(runs), self.view
        runs.check(view.chunks.columns.tokens, view.location)
        early = self._early.take(EarlyReads.key(*runs))
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
        out = gather_runs(lambda c: pieces[-1 - c] if c < 0 else self.tokens(c),
                          Runs(chunk, offset, runs.length), view.dtype)
        self._checks().batch_ids(out, runs.stream_offset(view.cum_tokens))
        return out

    def _plan(self, runs: Runs, early: bool = False, skip: set[int] | frozenset[int] = frozenset()
              ) -> tuple[list[int], npt.NDArray[np.int64]] | None:
        """The chunks of ``runs`` to read by ranged GETs and the rows of ``runs`` in them;
        None: read from the local copy. Only chunks downloading are read by ranged GETs:
        one not downloading (queued for room) is downloaded by the chunk's own read, and
        a download that ended without landing failed, so the chunk's own read raises its
        error; and, read now, none where every one is expected to land within two round
        trips (``early``, a coming batch's: whenever one is away — the expected landing
        is an estimate, and a wait for a late one is what the early read avoids).
        ``skip``: chunks whose runs are read already."""
        some, ahead, chunks = runs.length > 0, self._prefetcher(), self.view.chunks
        etas = {c: ahead.eta(chunks[c].stem + ".bin")
                for c in np.unique(runs.chunk[some]).tolist()
                if c not in skip and not self._on_node(c)}
        away = [c for c, eta in etas.items() if eta]
        if not away or not (early or self._arriving.worth([etas[c] for c in away])):  # type: ignore[misc]
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
        one round trip, checked against the ledger)."""
        infos = [self.view.chunks[c] for c in chunks]
        with self._early.meta_lock:  # early reads of several batches: one fetch
            missing = [i for i in infos if i.stem not in self._metas]
            for info, data in zip(missing, self.read_many([i.stem + META_SUFFIX
                                                           for i in missing]), strict=True):
                self._load_meta(info, data)
        sums = {c: BlockSums.of(self.meta_of(i)) for c, i in zip(chunks, infos, strict=True)}
        return {c: s for c, s in sums.items() if s is not None}

    def _hand_over(self, chunks: list[int]) -> None:
        """Make sure the whole of ``chunks`` is downloading (or queued to)."""
        ahead, size = self._prefetcher(), self.view.dtype.itemsize
        for c in chunks:
            info = self.view.chunks[c]
            ahead.add(info.stem + ".bin", info.tokens * size, partial(self._fetch, info, ".bin"))

    # -- downloads ahead -----------------------------------------------------------------
    @property
    def prefetches(self) -> bool:  # type: ignore[override]
        """Worth a reader's work per batch while some chunk of the view is not mapped in
        this process (a cache of a few chunks, all mapped: its batches skip the look-ahead
        and the window assembly's ``here`` check)."""
        return self._view is not None and len(self._maps) < len(self._view.chunks)

    def prefetch(self, chunks: Iterable[int]) -> bool:
        """Start downloading ``chunks`` as far ahead as the measured pace needs and
        ``local_bytes`` allows (:mod:`shardwise.storage.prefetch`); errors surface when
        the chunk is used."""
        ahead = self._prefetcher()
        chunks = list(chunks)
        if ahead.same_as_last(chunks):  # a batch like the one before: handed over already
            return ahead.wants_more()
        for c in chunks:
            if c in self._maps or (self._all_fit() and self._on_node(c)):
                continue  # mapped, or on the node for good: nothing to download or pin
            info = self.view.chunks[c]
            ahead.add(info.stem + ".bin", info.tokens * self.view.dtype.itemsize,
                      partial(self._fetch, info, ".bin"))  # its metadata comes with it
        return ahead.wants_more()

    def prefetch_runs(self, runs: Any) -> bool:
        """:meth:`prefetch` of the chunks of ``runs`` (a coming batch's, in order), and,
        while they arrive, the batch's ranged GETs started now (:class:`EarlyReads`): the
        reader is asked for more batches while fewer than ``DEPTH`` are read ahead."""
        runs = Runs.of(runs[:3])  # an order's runs carry more columns
        more = self.prefetch(list(dict.fromkeys(runs.chunk[runs.length > 0].tolist())))
        if not self.ranged:
            return more
        plan = self._plan(runs, early=True)
        if plan is None:
            return more
        self._early.start(EarlyReads.key(*runs), partial(self._read_ranged, runs, *plan))
        return more or self._early.wants_more()

    def _prefetcher(self) -> Prefetcher:
        if self._ahead is None:
            local = self._downloads().max_bytes
            self._ahead = (Prefetcher(local, held=self._held_bytes) if self.paced_budget
                           else Prefetcher(local // 2))
        return self._ahead

    def _held_bytes(self) -> int:
        """Bytes of the chunks this reader has mapped (not room for downloads ahead)."""
        tokens = self.view.chunks.columns.tokens
        return int(sum(int(tokens[c]) for c in self._maps)) * self.view.dtype.itemsize

    def stats(self) -> dict[str, object]:
        a = self._arriving
        return {**self._prefetcher().stats(), "ranged_reads": a.reads,
                "ranged_bytes": a.read_bytes, "early_reads": self._early.started,
                "early_used": self._early.used}

    def wait_for_prefetch(self) -> None:
        if self._ahead is not None:
            self._ahead.wait()

    def close(self) -> None:
        self._early.close()
        if self._ahead is not None:
            self._ahead.close()
        super().close()

    def __getstate__(self) -> dict[str, object]:
        d = super().__getstate__()
        d["_ahead"], d["_arriving"], d["_early"] = None, Arriving(), EarlyReads()
        return d


__all__ = ["BucketStore"]
