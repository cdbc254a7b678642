"""The one interface to a cache's bytes: :class:`ChunkStore`.

It is everything that touches a cache's bytes (docs/DESIGN.md, "One
storage interface"): its files (the :class:`~shardwise.format.files.Files` half, which the
format and the build use) and its chunks (memory maps, ``.idx``, metadata, ``gather``,
downloads ahead, integrity checks). Two implementations: ``LocalStore``
(:mod:`shardwise.storage.local`) and ``BucketStore`` (:mod:`shardwise.storage.bucket`).
What differs between them is only where a chunk file's local bytes come from
(:meth:`ChunkStore.with_file`) and how its metadata is read; the maps, their budget, the
checks and ``gather`` (runs of stored tokens, :mod:`shardwise.storage.runs`, read
through the maps) are written once, here.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from shardwise.concurrency import ThreadPool
from shardwise.concurrency.bounded import Bounded
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import CacheError, ConfigError, CorruptChunkError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import META_SUFFIX, ChunkKind, ChunkMeta
from shardwise.format.files import Payload
from shardwise.format.megatron import MegatronIndex, open_bin, read_idx
from shardwise.storage import open_maps
from shardwise.storage.chunk_check import CheckDepth, ChunkExpect
from shardwise.storage.chunk_table import ChunkInfo, View
from shardwise.storage.integrity import CacheChecks
from shardwise.storage.runs import Mapped, Runs, gather_runs
from shardwise.storage.verify_report import VerifyReport

_T = TypeVar("_T")

MAX_OPEN_CHUNKS = 64


class ChunkStore(ABC):
    """A cache's files and chunks (see the module doc). The chunk half reads by the
    ledger's view it is bound to (:meth:`bind`: the :class:`~shardwise.storage.cache.Cache`
    that owns it); the files half needs no view (the build writes through it)."""

    checks_in_background: ClassVar[bool] = False  # hash chunk files a process opens
    # this node's directory of the cache (itself, or its local copy): reader files go here
    root: Path
    prefetches: ClassVar[bool] = False  # prefetch() downloads ahead: worth calling
    publishes_ahead: ClassVar[bool] = False  # a build uploads a chunk while making the next

    def __init__(self) -> None:
        self._view: View | None = None
        self.checks: CacheChecks | None = None
        self.opened: Counter[str] = Counter()  # chunks whose token data this process read
        self.opened_index: Counter[str] = Counter()  # ... whose .idx it read
        # the one owner of this process's maps of the cache's chunks and of every view
        # of them (Mapped: a chunk's map and the views gather reads it by, one entry),
        # bounded by max_open_chunks and by the process's descriptor budget (open_maps)
        self._maps: Bounded[int, Mapped] = open_maps.bounded(MAX_OPEN_CHUNKS)
        self._indexes: Bounded[int, MegatronIndex] = open_maps.bounded(MAX_OPEN_CHUNKS)
        self._checked_index: set[int] = set()
        self._metas: dict[str, ChunkMeta] = {}
        # this process's two threads (.local): verification, a chunk's uploads
        self._threads = ProcessLocal(partial(ThreadPool, 2, name="shardwise-store"),
                                     name="store threads")

    # -- files (format/files.py's Files) -----------------------------------------------
    @property
    @abstractmethod
    def location(self) -> str: ...
    @abstractmethod
    def name(self, relative: str) -> str: ...
    @abstractmethod
    def read(self, relative: str) -> bytes: ...
    @abstractmethod
    def write(self, relative: str, data: Payload) -> None: ...
    @abstractmethod
    def publish(self, stem: str, payloads: dict[str, Payload]) -> None: ...
    @abstractmethod
    def exists(self, relative: str) -> bool: ...
    @abstractmethod
    def keys(self) -> list[str]: ...
    @abstractmethod
    def remove(self, relatives: list[str]) -> None: ...
    @abstractmethod
    def read_fresh(self, relative: str) -> bytes: ...
    @abstractmethod
    def read_many(self, relatives: list[str]) -> list[bytes | Exception]: ...
    @abstractmethod
    def list_dir(self, relative: str) -> list[str]: ...
    @abstractmethod
    def stamp(self, relative: str) -> tuple[object, ...]: ...

    # -- what a build needs beyond the files -----------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache for one build (a store without locks: one build at a time)."""
        yield

    def tidy(self) -> None:
        """Remove what a killed build left half-written (nothing where writes are whole)."""
        return None

    @abstractmethod
    def clear(self) -> int:
        """Delete every file shardwise wrote (``--overwrite``), refusing before deleting
        anything if there are others; returns how many."""

    @abstractmethod
    def entries(self) -> list[str]:
        """What is there (a new cache must find nothing)."""

    @abstractmethod
    def foreign(self) -> list[str]:
        """Entries shardwise did not write."""

    @abstractmethod
    def check_published(self, exp: ChunkExpect, depth: CheckDepth) -> VerifyReport:
        """A published chunk against what the ledger expects of it (a build's rerun)."""

    # -- chunks ------------------------------------------------------------------------------
    def bind(self, view: View) -> None:
        """Read chunks by ``view`` (once, by the cache that owns this store)."""
        if self._view is not None and self._view is not view:
            raise CacheError(f"{self.location}: this store already serves another open "
                             "cache; open the cache again for a view of its own")
        self._view = view
        self.checks = CacheChecks(self, view)

    @property
    def view(self) -> View:
        if self._view is None:
            raise CacheError(f"{self.location}: opened for writing, not for reading; "
                             "read it with open_cache")
        return self._view

    @abstractmethod
    def with_file(self, info: ChunkInfo, suffix: str, use: Callable[[Path], _T]) -> _T:
        """``use(path)`` of a checked local copy of chunk file ``suffix``."""

    @abstractmethod
    def _meta_bytes(self, info: ChunkInfo) -> bytes | Exception:
        """A chunk's metadata bytes, or the error reading them raised."""

    @abstractmethod
    def bin_size(self, info: ChunkInfo) -> int:
        """The size of a chunk's ``.bin`` as stored (FileNotFoundError when missing)."""

    @property
    def max_open_chunks(self) -> int:
        """How many chunks this store keeps mapped (``.bin`` with its views, and ``.idx``
        apart); the least recently read is unmapped first. Set it before reading a cache
        of many chunks that a batch reads at random (each chunk mapped again costs ~11 us);
        the process's descriptor budget (:mod:`.open_maps`) caps all stores together."""
        return int(self._maps.items or MAX_OPEN_CHUNKS)

    @max_open_chunks.setter
    def max_open_chunks(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"max_open_chunks must be a positive integer, got {n!r}")
        self._maps.items = self._indexes.items = n

    def mapped(self) -> int:
        """Chunks mapped now (what the budget holds)."""
        return len(self._maps)

    def tokens(self, c: int) -> npt.NDArray[np.generic]:
        """Chunk ``c``'s token ids, memory-mapped (its size checked against the ledger;
        every map counted by :attr:`max_open_chunks` and the process's budget)."""
        return self._mapped(c).tokens

    def _mapped(self, c: int) -> Mapped:
        """Chunk ``c``'s entry: its map and the views gather reads it by."""
        hit = self._maps.get(c)
        if hit is not None:
            return hit
        info = self.view.chunks[c]
        if info.kind is not ChunkKind.TOKENS:
            raise CacheError(f"{info.base}: a {info.kind.value} chunk has no token array; "
                             "read it with the records reader")
        try:
            tokens = self.with_file(info, ".bin", lambda p: self._map_bin(info, p))
        except FileNotFoundError:
            raise CorruptChunkError(f"{self.name(info.stem + '.bin')}: named by the ledger "
                                    f"but missing; {self._advice()}") from None
        self.opened[info.stem] += 1
        entry = self._maps.put(c, Mapped(tokens))
        open_maps.kept(self._maps, c)
        self._checks().opened(c, (".bin", ".idx"))
        return entry

    def _map_bin(self, info: ChunkInfo, path: Path) -> npt.NDArray[np.generic]:
        """The ``.bin`` memory-mapped, after checking it holds exactly the ledger's tokens
        (a short file must be named, not fail inside numpy)."""
        dtype = self.view.dtype
        tokens, want = open_bin(path, dtype), info.tokens * dtype.itemsize
        if tokens.nbytes != want:
            raise CorruptChunkError(f"{path}: {tokens.nbytes} bytes, the ledger's "
                                    f"{info.tokens} tokens of {dtype.itemsize} bytes are "
                                    f"{want}; {self._advice()}")
        return tokens

    def index(self, c: int) -> MegatronIndex:
        """Chunk ``c``'s ``.idx`` (document lengths), memory-mapped and structure-checked;
        does not touch the chunk's token data."""
        idx = self._indexes.get(c)
        if idx is not None:
            return idx
        info = self.view.chunks[c]
        try:
            idx = self.with_file(info, ".idx", read_idx)
        except FileNotFoundError:
            raise CorruptChunkError(f"{self.name(info.stem + '.idx')}: named by the ledger "
                                    f"but missing; {self._advice()}") from None
        if c not in self._checked_index:
            self._checks().index(c, idx)
            self._checked_index.add(c)
        self.opened_index[info.stem] += 1
        self._indexes.put(c, idx)
        open_maps.kept(self._indexes, c)
        self._checks().opened(c, (".idx",))
        return idx

    def meta(self, c: int) -> ChunkMeta:
        """Chunk ``c``'s metadata, checked against the ledger."""
        return self.meta_of(self.view.chunks[c])

    def meta_of(self, info: ChunkInfo) -> ChunkMeta:
        """A chunk's metadata, read once per process and checked against the ledger."""
        meta = self._metas.get(info.stem)
        return meta if meta is not None else self._load_meta(info, self._meta_bytes(info))

    def _load_meta(self, info: ChunkInfo, data: bytes | Exception) -> ChunkMeta:
        """A chunk's metadata from its bytes (or the error reading them raised), checked
        against the ledger and kept (read once per process)."""
        meta = self._metas.get(info.stem)
        if meta is not None:
            return meta
        name = self.name(info.stem + META_SUFFIX)
        if isinstance(data, FileNotFoundError):
            raise CorruptChunkError(f"{name}: named by the ledger but missing; "
                                    f"{self._advice()}")
        if isinstance(data, Exception):
            raise data
        if bytes_checksum(data) != info.meta_xxh3:
            raise CorruptChunkError(f"{name}: xxh3_64 {bytes_checksum(data)}, the ledger "
                                    f"says {info.meta_xxh3}; {self._advice()}")
        try:
            meta = self._metas[info.stem] = ChunkMeta.from_dict(orjson.loads(data))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise CorruptChunkError(f"{name}: not valid chunk metadata ({e}); "
                                    f"{self._advice()}") from e
        return meta

    def gather(self, runs: Any) -> npt.NDArray[np.generic]:
        """The tokens of ``runs`` (columns ``chunk, offset, length``) concatenated, in the
        cache's dtype, runs checked inside their chunks and ids against the vocabulary: the
        only way from runs to tokens. How they are copied is chosen by their shape
        (:func:`~shardwise.storage.runs.gather_runs`: equal runs of one chunk in one numpy
        call, a few runs joined, many short ones indexed per chunk); where the bytes come
        from (a map, a download, ranged reads of a chunk still arriving) is the store's."""
        runs = Runs.of(runs)
        view = self._view if self._view is not None else self.view  # (raises: none)
        out = gather_runs(self._mapped, runs, view.dtype, view.chunks.columns.tokens,
                          lambda: view.location)
        (self.checks or self._checks()).batch_ids(out, runs)
        return out

    def _checks(self) -> CacheChecks:
        if self.checks is None:
            self.bind(self.view)  # raises: a store opened for writing has no view
        assert self.checks is not None
        return self.checks

    def _advice(self) -> str:
        return f"run 'shardwise verify {self.location}'"

    # -- downloads ahead (a no-op where the bytes are here) ------------------------------
    def prefetch(self, chunks: Iterable[int]) -> bool:
        """Start fetching chunks ``chunks`` (in the order they will be read) in the
        background; returns whether the reader should hand over coming chunks sooner."""
        return False

    def prefetch_runs(self, runs: Any) -> bool:
        """:meth:`prefetch` of the chunks ``runs`` (a coming batch's runs) read, in order;
        a store that can also start reading the batch's bytes now does so."""
        chunk, _, length = (np.asarray(a).reshape(-1) for a in runs[:3])
        return self.prefetch(list(dict.fromkeys(chunk[length > 0].tolist())))

    def read_early(self, runs: Any) -> bool:
        """Start reading the bytes of a coming batch (its runs) now, its chunks not handed
        over here (a DataLoader worker's: its loader's process downloads them); a store
        with its bytes here has nothing to start. Returns whether the reader may hand
        over more coming batches."""
        return False

    def reader_pace(self, own_s: float | None) -> None:
        """The reader's own time on its last batch, measured where it trains (None: it
        will be, from now on): a store that paces its reads by the reader's takes it."""
        return None  # a store with its bytes here has no pace to keep

    def wait_for_prefetch(self) -> None:
        """Block until every download :meth:`prefetch` started has finished."""
        return None

    def ready_for_workers(self) -> None:
        """Make now what DataLoader worker processes forked from this one would each make
        on their first read (a store with its bytes here: nothing)."""
        return None

    def stats(self) -> dict[str, object]:
        """The downloads ahead: how far, how many at once, and the pace they follow."""
        return {}

    # -- threads, close, pickling --------------------------------------------------------
    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        """Run ``job`` on this process's two threads (verification; a chunk's uploads)."""
        return self._threads.get().submit(job)

    def close(self) -> None:
        """Stop background work (a chunk being hashed is finished); drop memory maps."""
        if self.checks is not None and self.checks.verifier is not None:
            self.checks.verifier.stop()
        self._threads.close()
        self._maps.clear()
        self._indexes.clear()


__all__ = ["MAX_OPEN_CHUNKS", "ChunkStore"]
