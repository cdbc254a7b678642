"""An open cache: its visible chunks and their files (opened by
:mod:`shardwise.storage.opening`).

A :class:`Cache` is a view of the ledger's visible chunks in global order (a
:class:`~shardwise.storage.chunk_table.ChunkTable` of columns), with prefix sums of
documents and tokens, so that planning needs no chunk file. Chunk files are
memory-mapped lazily, one chunk at a time, on first use; ``opened`` counts the chunks
whose token data a process has touched (the locality contract is tested with it), and
``opened_index`` the chunks whose ``.idx`` (document lengths, metadata only) it has
read. :meth:`Cache.refresh` re-reads the ledger of a cache that is still being built: the
visible chunk list only ever grows.

A cache on an object store (``open_cache("s3://bucket/cache", local_dir=…,
local_bytes=…)``) reads its manifest and ledger from the store; a chunk file is
downloaded on first use into a node-local :class:`~shardwise.storage.download.DownloadDir`
(shared by the node's processes, bounded in bytes), checked against the chunk's metadata
(size, xxh3; the metadata against the ledger) and then memory-mapped like a local file. A
missing or damaged object is a :class:`CorruptChunkError` naming its URL.

What a cache checks as it is read (structure on open, ids per batch, checksums once per
node: in the background for local chunks) is described in
:mod:`shardwise.storage.integrity`; ``open_cache(..., verify=False)`` trusts the cache.
"""

from __future__ import annotations

import contextlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from shardwise.concurrency import ThreadPool
from shardwise.errors import CacheError, CorruptChunkError
from shardwise.format.chunk import META_SUFFIX, ChunkKind, ChunkMeta
from shardwise.format.ledger import LEDGER_NAME, read_view
from shardwise.format.ledger_index import ChunkColumns, SourceTotals
from shardwise.format.manifest import Manifest
from shardwise.format.megatron import MegatronIndex, open_bin, read_idx
from shardwise.format.paths import safe_join
from shardwise.remote.client import RemoteStore
from shardwise.storage import chunk_fetch, open_maps
from shardwise.storage.chunk_table import ChunkInfo, ChunkTable
from shardwise.storage.download import DownloadDir
from shardwise.storage.integrity import CacheChecks
from shardwise.storage.prefetch import Prefetcher

_T = TypeVar("_T")

MAX_OPEN_CHUNKS = 64


class Cache:
    """A read-only view of a cache. Create it with
    :func:`~shardwise.storage.opening.open_cache`."""

    def __init__(self, root: Path, *, manifest: Manifest | None,
                 chunks: ChunkTable | Sequence[ChunkInfo],
                 dtype: np.dtype, eod_id: int | None, vocab_size: int | None,
                 finished: bool, errors: dict[str, int], fingerprint: str,
                 store: RemoteStore | None = None, downloads: DownloadDir | None = None,
                 verify: bool = True, sources: Sequence[SourceTotals] = ()) -> None:
        self.root = root
        self.store, self.downloads = store, downloads
        self.verify = verify
        self._metas: dict[str, ChunkMeta] = {}
        self._threads: ThreadPool | None = None  # background verification
        self._ahead: Prefetcher | None = None  # downloads ahead (a cache on an object store)
        self._inside: set[str] = set()  # chunk files known to resolve inside the cache
        self.manifest = manifest
        self.dtype = dtype
        self.eod_id = eod_id
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.finished = finished
        self.errors = errors
        self.sources = list(sources)  # per source, every chunk the ledger names
        self.chunks = (chunks if isinstance(chunks, ChunkTable)
                       else ChunkTable.of(root, chunks, where=str(root)))
        self.cum_tokens = np.zeros(1, dtype=np.int64)
        self.cum_docs = np.zeros(1, dtype=np.int64)
        self.opened: Counter[str] = Counter()
        self.opened_index: Counter[str] = Counter()
        self._maps: OrderedDict[int, npt.NDArray[np.generic]] = OrderedDict()
        self._indexes: OrderedDict[int, MegatronIndex] = OrderedDict()
        self._checked_index: set[int] = set()
        self._extend(self.chunks.columns)
        self.checks = CacheChecks(self)

    def __repr__(self) -> str:
        state = "finished" if self.finished else "building"
        return (f"Cache({self.location!r}, chunks={len(self.chunks)}, "
                f"documents={self.num_documents}, tokens={self.num_tokens}, {state})")

    @property
    def location(self) -> str:
        """The cache's URL (on an object store) or directory."""
        return self.store.url if self.store is not None else str(self.root)

    @property
    def is_megatron(self) -> bool:
        return self.manifest is None

    @property
    def num_tokens(self) -> int:
        return int(self.cum_tokens[-1])

    @property
    def num_documents(self) -> int:
        return int(self.cum_docs[-1])

    def _extend(self, more: ChunkColumns) -> None:
        """Prefix sums of the chunks appended to the table (``more``)."""
        for name, column in (("cum_tokens", more.tokens), ("cum_docs", more.documents)):
            cum = getattr(self, name)
            setattr(self, name, np.concatenate([cum, cum[-1] + np.cumsum(column)]))

    def refresh(self) -> int:
        """Re-read the ledger; append newly visible chunks; return how many appeared."""
        if self.manifest is None or self.finished:
            return 0
        view, _ = read_view(self.store or self.root)
        differ = self.chunks.same_prefix(view.chunks)
        if differ >= 0:
            new = (view.chunks.stem[differ].decode() if differ < len(view.chunks)
                   else "nothing")
            raise CacheError(f"{self.root}: the ledger reordered published chunks "
                             f"({self.chunks[differ].stem} became {new}); the cache was "
                             "rebuilt under a running reader")
        fresh = view.chunks.tail(len(self.chunks))
        self.chunks.extend(fresh, where=self._ledger_name)
        self._extend(fresh)
        self.finished, self.errors, self.sources = view.finished, view.errors, view.sources
        return len(fresh)

    @property
    def _ledger_name(self) -> str:
        return (self.store.url_of(LEDGER_NAME) if self.store is not None
                else str(self.root / LEDGER_NAME))

    def _open(self, i: int) -> npt.NDArray[np.generic]:
        hit = self._maps.get(i)
        if hit is not None:
            with contextlib.suppress(KeyError):  # dropped by another cache's open meanwhile
                self._maps.move_to_end(i)
            return hit
        info = self.chunks[i]
        if info.kind is not ChunkKind.TOKENS:
            raise CacheError(f"{info.base}: a {info.kind.value} chunk has no token array; "
                             "read it with the records reader")
        bin_path = info.base.with_name(info.base.name + ".bin")
        try:
            tokens = self._local(info, ".bin", lambda p: self._map_bin(info, p))
        except FileNotFoundError:
            raise CorruptChunkError(f"{bin_path}: named by the ledger but missing; run "
                                    f"'shardwise verify {self.location}'") from None
        self.opened[info.stem] += 1
        self._maps[i] = tokens
        open_maps.kept(self._maps, i)
        if len(self._maps) > MAX_OPEN_CHUNKS:
            self._maps.popitem(last=False)
        self.checks.opened(i, (".bin", ".idx"))
        return tokens

    def _map_bin(self, info: ChunkInfo, path: Path) -> npt.NDArray[np.generic]:
        """The ``.bin`` memory-mapped, after checking it holds exactly the ledger's tokens
        (a short file must be named, not fail inside numpy)."""
        size, want = path.stat().st_size, info.tokens * self.dtype.itemsize
        if size != want:
            raise CorruptChunkError(f"{path}: {size} bytes, the ledger's {info.tokens} tokens "
                                    f"of {self.dtype.itemsize} bytes are {want}; run "
                                    f"'shardwise verify {self.location}'")
        # a plain ndarray view of the map: slicing an np.memmap subclass costs ~3 us of
        # Python per slice on the hot path; the view keeps the map alive
        return open_bin(path, self.dtype).view(np.ndarray)

    def tokens(self, i: int) -> npt.NDArray[np.generic]:
        """Chunk ``i``'s token ids (all its documents concatenated), memory-mapped."""
        return self._open(i)

    def index(self, i: int) -> MegatronIndex:
        """Chunk ``i``'s parsed ``.idx`` (document lengths), memory-mapped; does not touch
        the chunk's token data."""
        idx = self._indexes.get(i)
        if idx is not None:
            with contextlib.suppress(KeyError):
                self._indexes.move_to_end(i)
            return idx
        info = self.chunks[i]
        try:
            idx = self._local(info, ".idx", read_idx)
        except FileNotFoundError:
            raise CorruptChunkError(f"{info.base}.idx: named by the ledger but missing; run "
                                    f"'shardwise verify {self.location}'") from None
        if i not in self._checked_index:
            self.checks.index(i, idx)
            self._checked_index.add(i)
        self.opened_index[info.stem] += 1
        self._indexes[i] = idx
        open_maps.kept(self._indexes, i)
        if len(self._indexes) > MAX_OPEN_CHUNKS:
            self._indexes.popitem(last=False)
        self.checks.opened(i, (".idx",))
        return idx

    # -- files on an object store ----------------------------------------------------------
    def with_chunk_file(self, i: int, suffix: str, use: Callable[[Path], _T]) -> _T:
        """``use(local path)`` of chunk ``i``'s file ``suffix`` (``.bin``, ``.idx``, …),
        downloaded first (checked, bounded) when the cache is on an object store."""
        return self._local(self.chunks[i], suffix, use)

    def _local(self, info: ChunkInfo, suffix: str, use: Callable[[Path], _T]) -> _T:
        """``use(path)`` of chunk file ``suffix``: the file itself, or (remote) its local
        download; retried if another process evicted the download before ``use`` opened
        it."""
        if self.store is None:
            path = info.base.with_name(info.base.name + suffix)
            key = info.stem + suffix
            if self.manifest is not None and key not in self._inside:  # not a Megatron prefix
                safe_join(self.root, key, where=str(path))  # a symlink out is refused
                self._inside.add(key)
            return use(path)
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
        download ahead of the reader: :mod:`shardwise.storage.prefetch`; the round trips:
        :mod:`shardwise.storage.chunk_fetch`)."""
        return chunk_fetch.fetch_file(self, info, suffix, until)

    def meta(self, i: int) -> ChunkMeta:
        """Chunk ``i``'s metadata (its files' sizes and checksums), checked against the
        ledger."""
        return self._meta(self.chunks[i])

    def _meta(self, info: ChunkInfo) -> ChunkMeta:
        """A chunk's metadata, read once per process and checked against the ledger."""
        meta = self._metas.get(info.stem)
        if meta is not None:
            return meta
        if self.store is not None:  # with those of the chunks ahead, in one round trip
            read: Callable[[], bytes] = partial(
                self._prefetcher().small, info.stem + META_SUFFIX, self.store.get_many)
        else:
            read = partial(self._local, info, META_SUFFIX, Path.read_bytes)
        try:
            data: bytes | Exception = read()
        except FileNotFoundError as e:
            data = e
        return chunk_fetch.load_meta(self, info, data)

    # -- checks as chunks are read (shardwise.storage.integrity) -------------------------
    def raise_if_damaged(self) -> None:
        """Raise the damage background verification found in a chunk this process read
        (a reader calls this once per batch)."""
        if self.checks.verifier is not None:
            self.checks.verifier.raise_if_damaged()

    def wait_for_verify(self) -> None:
        """Block until the chunks read so far are verified; their damage is then raised
        by :meth:`raise_if_damaged`."""
        if self.checks.verifier is not None:
            self.checks.verifier.wait()

    def verify_stats(self) -> dict[str, int]:
        """Background verification so far: chunk checks that ``hashed`` data, that were
        ``skipped`` (verified before on this node), and ``queued``."""
        return self.checks.stats()

    def prefetch(self, chunks: Iterable[int]) -> bool:
        """Start downloading chunks ``chunks`` (global indices, in the order they will be
        read) in the background, as far ahead as the measured pace needs and
        ``local_bytes`` allows (:mod:`shardwise.storage.prefetch`); errors surface when
        the chunk is used. Returns whether the reader should hand over its coming chunks
        sooner (always False for a local cache, which never prefetches)."""
        if self.store is None:
            return False
        ahead = self._prefetcher()
        chunks = list(chunks)
        if ahead.same_as_last(chunks):  # a batch like the one before: handed over already
            return ahead.wants_more()
        for c in chunks:
            if c in self._maps:  # already mapped: its file is here
                continue
            info = self.chunks[c]
            ahead.add(info.stem + ".bin", info.tokens * self.dtype.itemsize,
                      partial(self._fetch, info, ".bin"))  # its metadata comes with it
        return ahead.wants_more()

    def _prefetcher(self) -> Prefetcher:
        if self._ahead is None:
            budget = self.downloads.max_bytes // 2 if self.downloads is not None else 0
            self._ahead = Prefetcher(budget)
        return self._ahead

    def prefetch_stats(self) -> dict[str, object]:
        """The downloads ahead: how far, how many at once, and the pace they follow."""
        return self._prefetcher().stats()

    def _submit(self, job: Callable[[], _T]) -> Future[_T]:
        """Run ``job`` on this process's two background verification threads, started on
        first use (a forked child starts its own)."""
        if self._threads is None:
            self._threads = ThreadPool(2, name="shardwise-verify")
        return self._threads.submit(job)

    def wait_for_prefetch(self) -> None:
        """Block until every download :meth:`prefetch` started has finished (e.g. to warm a
        node's local copy before training); their errors surface when a chunk is used."""
        if self._ahead is not None:
            self._ahead.wait()

    def close(self) -> None:
        """Stop background downloads and verification (queued ones are dropped; a chunk
        being hashed is finished) and drop memory maps."""
        if self.checks.verifier is not None:
            self.checks.verifier.stop()
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        if self._ahead is not None:
            self._ahead.close()
        self._maps.clear()
        self._indexes.clear()

    def __getstate__(self) -> dict[str, object]:
        """A copy for another process (a spawned DataLoader worker): no download threads
        and no memory maps (a map pickles as a copy of its whole chunk); the copy maps
        what it reads."""
        d = dict(self.__dict__)
        d["_threads"], d["_ahead"] = None, None
        d["_maps"], d["_indexes"] = OrderedDict(), OrderedDict()
        return d

    def doc_lengths(self, i: int) -> npt.NDArray[np.integer]:
        return self.index(i).document_lengths

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.generic]:
        """Tokens ``[start, stop)`` of the concatenated stream (may span chunks)."""
        first = int(np.searchsorted(self.cum_tokens, start, side="right")) - 1
        parts = []
        pos = start
        c = first
        while pos < stop:
            lo = pos - int(self.cum_tokens[c])
            hi = min(stop, int(self.cum_tokens[c + 1])) - int(self.cum_tokens[c])
            parts.append(self.tokens(c)[lo:hi])
            pos += hi - lo
            c += 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)


def __getattr__(name: str) -> object:
    """``open_cache`` and ``reader_cache`` moved to :mod:`shardwise.storage.opening`; this
    keeps ``from shardwise.storage.cache import open_cache`` (code written before the move)
    working. Import them from ``shardwise.storage.opening``."""
    if name in ("open_cache", "reader_cache"):
        from shardwise.storage import opening

        return getattr(opening, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
