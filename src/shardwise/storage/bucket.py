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
from typing import TypeVar

from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import CacheError
from shardwise.format.chunk import META_SUFFIX
from shardwise.format.files import Payload
from shardwise.remote.client import RemoteStore
from shardwise.storage import chunk_fetch
from shardwise.storage.bucket_ranged import RangedGather
from shardwise.storage.chunk_check import CheckDepth, ChunkExpect, check_remote_chunk
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.download import GROUP, DownloadDir
from shardwise.storage.heads import NodeHeads
from shardwise.storage.owned import clear_keys, is_owned
from shardwise.storage.prefetch import Prefetcher
from shardwise.storage.ranged import Arriving, EarlyReads
from shardwise.storage.verify_report import VerifyReport

_T = TypeVar("_T")


def _read_or_error(read: Callable[[str], bytes], name: str) -> bytes | Exception:
    try:
        return read(name)
    except FileNotFoundError as e:
        return e


class BucketStore(RangedGather):
    """The :class:`~shardwise.storage.store.ChunkStore` of a prefix on an object store;
    ``downloads``: the node-local copy chunks are read through (None: for writing only);
    ``heads``: where the manifest, ledger and index are read (this node's snapshot of
    them, :mod:`shardwise.storage.heads`; None: from the store, as a build does).

    (``bench remote --ablate`` measures each way it reads faster than a whole-chunk
    reader by a subclass of its own that reads without it: :mod:`shardwise.bench.levers`.)
    """

    group = GROUP  # a chunk file's blocks asked for at once


    def __init__(self, remote: RemoteStore, downloads: DownloadDir | None = None, *,
                 heads: NodeHeads | None = None) -> None:
        super().__init__()
        self.remote, self.downloads, self.heads = remote, downloads, heads
        # this process's reading (.local): downloads ahead, ranged reads of coming batches
        # started ahead, and what arriving chunks were measured at; a copy in another
        # process, forked or pickled, starts its own
        self._ahead = ProcessLocal(self._new_prefetcher, name="downloads ahead")
        self._early_here = ProcessLocal(EarlyReads, name="early reads")
        self._arriving_here = ProcessLocal(Arriving, name="arrivals")
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
        """With those of the chunks ahead, in one round trip (checked against the ledger,
        so through the GIL-free client)."""
        try:
            return self._prefetcher().small(info.stem + META_SUFFIX,
                                            partial(self.remote.get_many, checked=True))
        except FileNotFoundError as e:
            return e

    def bin_size(self, info: ChunkInfo) -> int:
        """From the metadata: the ``.bin`` may not be here yet."""
        return int(self.meta_of(info).files.get(".bin", {}).get("bytes", -1))

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

    # -- downloads ahead -----------------------------------------------------------------
    @property
    def prefetches(self) -> bool:  # type: ignore[override]
        """Worth a reader's work per batch while some chunk of the view is neither mapped
        in this process nor on the node for good (:meth:`_on_node`): a cache of a few
        chunks, all here, skips the look-ahead — also where DataLoader workers read and
        this process maps nothing (its index stream located every batch, ~0.1 ms each)."""
        if self._view is None:
            return False
        n, here, mapped = len(self._view.chunks), len(self._here), len(self._maps)
        if max(here, mapped) >= n:
            return False
        # asked per batch: the union (a set of up to every chunk) only near the end
        return here + mapped < n or len(self._here.union(self._maps)) < n

    def prefetch(self, chunks: Iterable[int]) -> bool:
        """Start downloading ``chunks`` as far ahead as the measured pace needs and
        ``local_bytes`` allows (:mod:`shardwise.storage.prefetch`); errors surface when
        the chunk is used."""
        ahead = self._prefetcher()
        chunks = list(chunks)
        if ahead.same_as_last(chunks):  # a batch like the one before: handed over already
            return ahead.wants_more(len(self.view.chunks) - len(self._here.union(self._maps)))
        for c in chunks:
            if c in self._maps or (self._all_fit() and self._on_node(c)):
                continue  # mapped, or on the node for good: nothing to download or pin
            info = self.view.chunks[c]
            ahead.add(info.stem + ".bin", info.tokens * self.view.dtype.itemsize,
                      partial(self._fetch, info, ".bin"))  # its metadata comes with it
        return ahead.wants_more(len(self.view.chunks) - len(self._here.union(self._maps)))

    def _prefetcher(self) -> Prefetcher:
        return self._ahead.get()

    @property
    def _early(self) -> EarlyReads:
        return self._early_here.get()

    @property
    def _arriving(self) -> Arriving:
        return self._arriving_here.get()

    def _new_prefetcher(self) -> Prefetcher:
        """Downloads ahead within ``local_bytes`` less what this reader holds mapped."""
        return Prefetcher(self._downloads().max_bytes, held=self._held_bytes)

    def _held_bytes(self) -> int:
        """Bytes of the chunks this reader has mapped (not room for downloads ahead)."""
        tokens = self.view.chunks.columns.tokens
        return int(sum(int(tokens[c]) for c in self._maps)) * self.view.dtype.itemsize

    def stats(self) -> dict[str, object]:
        a = self._arriving
        return {**self._prefetcher().stats(), "ranged_reads": a.reads,
                "ranged_bytes": a.read_bytes, "early_reads": self._early.started,
                "early_used": self._early.used, **a.stats()}

    def wait_for_prefetch(self) -> None:
        ahead = self._ahead.made
        if ahead is not None:
            ahead.wait()

    def close(self) -> None:
        self._early_here.close()
        self._ahead.close()
        super().close()


__all__ = ["BucketStore"]
