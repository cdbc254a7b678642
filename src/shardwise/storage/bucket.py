"""A cache on an object store: a prefix reached through
:class:`~shardwise.remote.client.RemoteStore`, read through a node-local, byte-bounded
copy.

Writes are whole objects, one PUT each, in the order the format gives (a chunk's data,
then its metadata; the ledger last). Reads: a chunk file is downloaded on first use into
the node's :class:`~shardwise.storage.download.DownloadDir` (shared by the node's
processes, bounded by ``local_bytes``), checked as it streams against the chunk's
metadata (size, xxh3; the metadata against the ledger) and then memory-mapped like a local
file; downloads ahead follow the measured pace (:mod:`shardwise.storage.prefetch`), and a
``.bin`` comes with its metadata in one round trip (:mod:`shardwise.storage.chunk_fetch`).
A missing or damaged object is a :class:`CorruptChunkError` naming its URL.

Where ranged reads of just a batch's bytes will go while a chunk is still arriving (issue
21 item 2): :meth:`BucketStore.gather` — today it waits for each chunk's local copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy.typing as npt

from shardwise.errors import CacheError
from shardwise.format.chunk import META_SUFFIX
from shardwise.format.files import Payload
from shardwise.remote.client import RemoteStore
from shardwise.storage import chunk_fetch
from shardwise.storage.chunk_check import CheckDepth, ChunkExpect, check_remote_chunk
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.download import DownloadDir
from shardwise.storage.heads import HEAD_NAMES, NodeHeads
from shardwise.storage.owned import clear_keys, is_owned
from shardwise.storage.prefetch import Prefetcher
from shardwise.storage.store import ChunkStore
from shardwise.storage.verify_report import VerifyReport

_T = TypeVar("_T")


class BucketStore(ChunkStore):
    """The :class:`~shardwise.storage.store.ChunkStore` of a prefix on an object store;
    ``downloads``: the node-local copy chunks are read through (None: for writing only);
    ``heads``: where the manifest, ledger and index are read (this node's snapshot of
    them, :mod:`shardwise.storage.heads`; None: from the store, as a build does)."""

    prefetches = True

    def __init__(self, remote: RemoteStore, downloads: DownloadDir | None = None, *,
                 heads: NodeHeads | None = None) -> None:
        super().__init__()
        self.remote, self.downloads, self.heads = remote, downloads, heads
        self._ahead: Prefetcher | None = None  # downloads ahead

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
        if self.heads is not None and relative in HEAD_NAMES:
            return self.heads.read(relative)
        return self.remote.get(relative)

    def write(self, relative: str, data: Payload) -> None:
        self.remote.put(relative, data)

    def publish(self, stem: str, payloads: dict[str, Payload]) -> None:
        for suffix, data in payloads.items():  # one whole-object PUT each, in order
            self.remote.put(stem + suffix, data)

    def exists(self, relative: str) -> bool:
        return self.remote.exists(relative)

    def list(self) -> list[str]:
        return self.remote.list_keys()

    def remove(self, relatives: list[str]) -> None:
        self.remote.remove(relatives)

    # -- a build -------------------------------------------------------------------------
    def clear(self) -> int:
        return clear_keys(self)

    def entries(self) -> list[str]:
        return self.list()

    def foreign(self) -> list[str]:
        return [k for k in self.list() if not is_owned(k)]

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
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _download(self, info: ChunkInfo, suffix: str) -> Path:
        """The local copy of a chunk file: a prefetched one if its download succeeded."""
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
                                                   partial(self._load_meta, info), until)
        return chunk_fetch.fetch_checked(self.remote, downloads, info, suffix,
                                         self.meta_of(info), until)

    def _meta_bytes(self, info: ChunkInfo) -> bytes | Exception:
        """With those of the chunks ahead, in one round trip."""
        try:
            return self._prefetcher().small(info.stem + META_SUFFIX, self.remote.get_many)
        except FileNotFoundError as e:
            return e

    def bin_size(self, info: ChunkInfo) -> int:
        """From the metadata: the ``.bin`` may not be here yet."""
        return int(self.meta_of(info).files.get(".bin", {}).get("bytes", -1))

    def gather(self, runs: Any) -> npt.NDArray[Any]:
        """From the local copy of each chunk (issue 21 item 2 adds ranged reads of just
        these bytes while a chunk is still arriving)."""
        return super().gather(runs)

    # -- downloads ahead -----------------------------------------------------------------
    def prefetch(self, chunks: Iterable[int]) -> bool:
        """Start downloading ``chunks`` as far ahead as the measured pace needs and
        ``local_bytes`` allows (:mod:`shardwise.storage.prefetch`); errors surface when
        the chunk is used."""
        ahead = self._prefetcher()
        chunks = list(chunks)
        if ahead.same_as_last(chunks):  # a batch like the one before: handed over already
            return ahead.wants_more()
        for c in chunks:
            if c in self._maps:  # already mapped: its file is here
                continue
            info = self.view.chunks[c]
            ahead.add(info.stem + ".bin", info.tokens * self.view.dtype.itemsize,
                      partial(self._fetch, info, ".bin"))  # its metadata comes with it
        return ahead.wants_more()

    def _prefetcher(self) -> Prefetcher:
        if self._ahead is None:
            self._ahead = Prefetcher(self._downloads().max_bytes // 2)
        return self._ahead

    def stats(self) -> dict[str, object]:
        return self._prefetcher().stats()

    def wait_for_prefetch(self) -> None:
        if self._ahead is not None:
            self._ahead.wait()

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        super().close()

    def __getstate__(self) -> dict[str, object]:
        d = super().__getstate__()
        d["_ahead"] = None
        return d


__all__ = ["BucketStore"]
