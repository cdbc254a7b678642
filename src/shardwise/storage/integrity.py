"""What keeps damaged bytes from reaching a model: the readers' checks, cheapest first.

1. **Structure, when a chunk is opened** (:class:`~shardwise.storage.store.ChunkStore`): every
   file resolves inside the cache; the ``.bin`` holds exactly the ledger's tokens; the
   ``.idx`` agrees with the ``.bin`` and the ledger
   (:func:`~shardwise.format.megatron.check_index`). Once per chunk per process.
2. **Token ids, per batch** (:func:`~shardwise.format.megatron.first_bad_id`): one
   vectorised reduction over the batch's ids, which must lie in ``[0, vocab_size)``; an
   id outside is a :class:`CorruptChunkError` naming the chunk file and the id.
3. **Checksums, once per node.** Where a chunk is read whole anyway (stream placement)
   its bytes are hashed in memory before use; a download from an object store is hashed
   as it streams. Where reads are random (global placement) a :class:`ChunkVerifier`
   hashes each chunk file a process opens, and checks all its ids against the
   vocabulary, on the cache's background thread, while batches are served; the first
   damage it finds is raised by the next batch::

       batch 7 opens chunk 3 ─▶ served (its ids were in range)   verifier: hashing chunk 3
       batch 8               ─▶ CorruptChunkError: chunk 3's .bin xxh3_64 …, the metadata says …

   Verified files are appended to a :class:`VerifiedLog`, so the node's other processes
   (ranks, DataLoader workers) and later runs skip them. Once every chunk a process has
   opened is verified (ids included), the per-batch id check of 2 has nothing left to
   find and is skipped (:meth:`CacheChecks.batch_ids`): a long run pays for it only
   while its chunks are first read.

``open_cache(..., verify=False)`` (``--no-verify``) turns off 2 and 3 for a trusted cache.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardwise.errors import CorruptChunkError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import ChunkMeta
from shardwise.format.ledger import ChunkEntry
from shardwise.format.megatron import MegatronIndex, check_index, first_bad_id
from shardwise.format.paths import READER_DIR, user_cache_dir
from shardwise.storage.chunk_check import ChunkExpect, check_chunk
from shardwise.storage.chunk_table import ChunkInfo, View

Submit = Callable[[Callable[[], None]], Future[None]]
LOG_DIR = "verified"


class VerifiedLog:
    """The chunk files this node has checksum-verified: one line per file, appended by
    every process of the node (one ``write`` of a short line with ``O_APPEND``, so lines
    never interleave), read incrementally before each hash. A line names the file, the
    checksum it matched, the file's identity (size, mtime, device, inode: a file
    rewritten or replaced since is hashed again) and the vocabulary its ids were checked
    against::

        chunks/00000/00000-00003.bin 73c71401c9da7d92 18698 1718000000123456789 2049 77 ids<50000

    ``dirs``: where to keep it, in order (the cache's reader directory, then the user's
    cache directory when that is not writable); ``name`` is per cache and per host, so a
    cache on a shared file system gets one log per node. Unwritable everywhere: nothing
    is recorded, and every process verifies on its own.
    """

    def __init__(self, dirs: list[Path], name: str) -> None:
        self.paths = [d / LOG_DIR / f"{name}.{socket.gethostname()}.log" for d in dirs]
        self._seen: set[str] = set()
        self._read: dict[Path, int] = {}

    @staticmethod
    def key(rel: str, xxh3: str, st: os.stat_result, vocab_size: int | None) -> str:
        """The line for file ``rel``; ``vocab_size``: its ids were checked below it."""
        return (f"{rel} {xxh3} {st.st_size} {st.st_mtime_ns} {st.st_dev} {st.st_ino} "
                f"ids<{vocab_size}")

    def __contains__(self, key: str) -> bool:
        if key not in self._seen:
            self._catch_up()
        return key in self._seen

    def add(self, key: str) -> None:
        self._seen.add(key)
        line = (key + "\n").encode()
        for path in list(self.paths):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError:  # read-only, or not a directory: try the next place
                self.paths.remove(path)
                continue
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return

    def _catch_up(self) -> None:
        """Read the lines other processes appended since the last look."""
        for path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self._read.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            self._read[path] = self._read.get(path, 0) + end
            self._seen.update(data[:end].decode(errors="replace").splitlines())


class ChunkVerifier:
    """Hashes the chunk files a process uses, one at a time, on a background thread.

    ``check(chunk, suffixes)`` does the work (the cache's call of
    :func:`~shardwise.storage.chunk_check.check_chunk`, skipping files the node log lists) and
    returns whether it hashed anything and the problem found (or None); ``submit`` runs a
    job on the cache's background threads. :meth:`want` queues a chunk's files on first
    use; the drain job takes them in order and stops at the first damage, which
    :meth:`raise_if_damaged` (called once per batch) raises from then on.

    Fork-safe: in a forked child (a DataLoader worker) a fork hook gives every verifier a
    fresh lock and re-queues what its parent had not finished (the parent's thread does
    not exist there); the next batch resumes the work. Pickle-safe: a copy keeps what was
    verified and found, not the queue or the lock. At interpreter exit the job stops
    after the file in hand.

    State (``stats()``): ``hashed`` (chunk checks that read data), ``skipped`` (already
    verified on this node), ``queued``.
    """

    def __init__(self, check: Callable[[int, tuple[str, ...]], tuple[bool, str | None]],
                 submit: Submit) -> None:
        self._check, self._submit = check, submit
        self._queued: set[tuple[int, tuple[str, ...]]] = set()  # wanted, not dropped
        self._done: set[tuple[int, tuple[str, ...]]] = set()
        self.damage: BaseException | None = None
        self.hashed = self.skipped = 0
        self._dropped = False  # close() dropped queued files: never settled again
        self._reset()

    def _reset(self) -> None:
        """A fresh lock and queue for this process (created, forked or unpickled)."""
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, tuple[str, ...]]] = deque(
            sorted(self._queued - self._done))
        self._running = False
        # every file wanted so far is verified and intact (read without a lock)
        self.settled = not self._queue and self.damage is None and not self._dropped
        _after_fork_reset(self)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("_cond", "_queue", "_running"):
            d.pop(k)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._reset()

    def want(self, chunk: int, suffixes: tuple[str, ...]) -> None:
        """Verify ``chunk``'s files ``suffixes`` in the background (once per process)."""
        key = (chunk, suffixes)
        if key in self._queued:
            return
        with self._cond:
            self._queued.add(key)
            self._queue.append(key)
            self.settled = False
            self._start()

    def _start(self) -> None:
        """Under the lock: run the drain job unless it runs or nothing waits."""
        if not self._running and self._queue and self.damage is None:
            self._running = True
            self._submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._cond:
                if (not self._queue or self.damage is not None
                        or not threading.main_thread().is_alive()):
                    self._running = False
                    self.settled = (not self._queue and self.damage is None
                                    and not self._dropped)
                    self._cond.notify_all()
                    return
                key = self._queue[0]
            error: BaseException | None = None
            try:
                hashed, problem = self._check(*key)
            except BaseException as e:  # raised to the reader at its next batch
                error = e
            else:
                self.hashed, self.skipped = self.hashed + hashed, self.skipped + (not hashed)
                error = CorruptChunkError(problem) if problem is not None else None
            with self._cond:
                if self._queue and self._queue[0] == key:
                    self._queue.popleft()
                self._done.add(key)
                self.damage = self.damage or error
                self._cond.notify_all()

    def raise_if_damaged(self) -> None:
        """Raise the damage the background verification found (cheap: no lock, no system
        call); resume work a fork left queued."""
        if self.damage is not None:
            raise self.damage
        if self._queue and not self._running:
            with self._cond:
                self._start()

    def wait(self) -> None:
        """Block until every queued file is verified (or damage is found)."""
        with self._cond:
            self._start()
            while self._running:
                self._cond.wait()

    def stop(self) -> None:
        """Drop what is queued (the job in hand finishes its file); a later :meth:`want`
        of a dropped file queues it again."""
        with self._cond:
            self._queued.difference_update(self._queue)
            self._dropped = self._dropped or bool(self._queue)
            self._queue.clear()

    def stats(self) -> dict[str, int]:
        return {"hashed": self.hashed, "skipped": self.skipped, "queued": len(self._queue)}


def _after_fork_reset(verifier: ChunkVerifier) -> None:
    """Track ``verifier`` so that a forked child resets it (the hook is installed on first
    use, never at import)."""
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_reset_in_child)
        _FORK_HOOK.append(True)
    _VERIFIERS.add(verifier)


def _reset_in_child() -> None:
    for verifier in list(_VERIFIERS):
        verifier._reset()


_VERIFIERS: weakref.WeakSet[ChunkVerifier] = weakref.WeakSet()
_FORK_HOOK: list[bool] = []


class Store(Protocol):
    """What the checks need of a :class:`~shardwise.storage.store.ChunkStore`."""

    root: Path
    checks_in_background: bool  # False: its files are checked as they arrive

    def name(self, relative: str) -> str: ...
    def meta_of(self, info: ChunkInfo) -> ChunkMeta: ...
    def bin_size(self, info: ChunkInfo) -> int: ...
    def submit(self, job: Callable[[], None]) -> Future[None]: ...


class CacheChecks:
    """The checks of one open cache (see the module doc), over its ``store`` and the
    ledger's ``view``: the store calls :meth:`index` and :meth:`opened` as it opens chunk
    files, readers call :meth:`ids` per batch (and :meth:`loaded` for a chunk read
    whole). ``verify`` False keeps only the structural checks."""

    def __init__(self, store: Store, view: View, *, background: bool = True) -> None:
        self.store, self.view, self.verify = store, view, view.verify
        self.vocab_size = view.vocab_size if view.verify else None
        # None: no id to check (not verifying, no vocabulary, or the dtype cannot hold an
        # id beyond it); ids are read from this dtype, so no wider copy can either
        self._limit = self.vocab_size
        if self._limit is not None and first_bad_id(
                np.full(1, np.iinfo(view.dtype).max, view.dtype), self._limit) < 0:
            self._limit = None
        self.verifier: ChunkVerifier | None = None
        if (background and view.verify and not view.is_megatron
                and store.checks_in_background):
            self.log = VerifiedLog([store.root / READER_DIR, user_cache_dir()],
                                   view.fingerprint)
            self.verifier = ChunkVerifier(self._verify_files, store.submit)

    def _name(self, c: int, suffix: str) -> str:
        return self.store.name(self.view.chunks[c].stem + suffix)

    def _advice(self) -> str:
        return f"run 'shardwise verify {self.view.location}'"

    def index(self, c: int, idx: MegatronIndex) -> None:
        """Chunk ``c``'s ``.idx`` against its ``.bin`` (its size from the metadata on an
        object store, where the ``.bin`` may not be here yet) and against the ledger: an
        edited length must not shift document boundaries unannounced."""
        view, info = self.view, self.view.chunks[c]
        bin_name = self._name(c, ".bin")
        try:
            size = self.store.bin_size(info)
        except FileNotFoundError:
            raise CorruptChunkError(f"{bin_name}: named by the ledger but missing; "
                                    f"{self._advice()}") from None
        check_index(idx, bin_name, size)
        # a Megatron prefix's documents may hold several sequences each
        docs = idx.num_documents if view.is_megatron else idx.num_sequences
        got = (docs, idx.num_tokens, idx.dtype)
        want = (info.documents, info.tokens, view.dtype)
        if got != want:
            raise CorruptChunkError(f"{idx.path}: holds {got[0]} documents, {got[1]} tokens "
                                    f"of {got[2]}; the ledger says {want[0]}, {want[1]} of "
                                    f"{want[2]}; {self._advice()}")

    def opened(self, c: int, suffixes: tuple[str, ...]) -> None:
        """Chunk ``c``'s files ``suffixes`` are in use: verify them in the background."""
        if self.verifier is not None:
            self.verifier.want(c, suffixes)

    def batch_ids(self, ids: npt.NDArray[Any], offset_of: Callable[[int], int]) -> None:
        """:meth:`ids` for a batch read from memory-mapped chunks (:meth:`Cache.tokens`),
        skipped once every chunk this process opened is verified: the background check
        has then seen every id such a batch can hold."""
        if self.verifier is not None and self.verifier.settled:
            return
        self.ids(ids, offset_of)

    def ids(self, ids: npt.NDArray[Any], offset_of: Callable[[int], int]) -> None:
        """Refuse ids outside ``[0, vocab_size)`` (one vectorised check per batch);
        ``offset_of(k)``: the stream offset of flat element ``k``, to name its chunk."""
        if self._limit is None:
            return
        k = first_bad_id(ids, self._limit)
        if k < 0:
            return
        cum, offset = self.view.cum_tokens, offset_of(k)
        c = int(np.searchsorted(cum, offset, side="right")) - 1
        raise CorruptChunkError(
            f"{self._name(c, '.bin')}: token id {int(ids.reshape(-1)[k])} at token "
            f"{offset - int(cum[c])} of the chunk, outside the vocabulary of "
            f"{self.vocab_size} ids (the manifest's vocab_size): damaged bytes, or a cache "
            f"built with another tokenizer; {self._advice()}")

    def loaded(self, c: int, tokens: npt.NDArray[np.generic]) -> None:
        """Chunk ``c``'s tokens, read whole into memory: their checksum, before any use,
        then their ids."""
        if not self.verify:
            return
        if not self.view.is_megatron:
            want = self.store.meta_of(self.view.chunks[c]).files.get(".bin", {}).get("xxh3_64")
            got = bytes_checksum(tokens.data.cast("B") if tokens.nbytes else b"")
            if got != want:
                raise CorruptChunkError(f"{self._name(c, '.bin')}: xxh3_64 {got}, the "
                                        f"metadata says {want}; {self._advice()}")
        base = int(self.view.cum_tokens[c])
        self.ids(tokens, lambda k: base + k)

    def stats(self) -> dict[str, int]:
        if self.verifier is None:
            return {"hashed": 0, "skipped": 0, "queued": 0}
        return self.verifier.stats()

    def _verify_files(self, c: int, suffixes: tuple[str, ...]) -> tuple[bool, str | None]:
        """On the background thread: chunk ``c``'s files ``suffixes`` against their
        checksums (:func:`~shardwise.storage.chunk_check.check_chunk`), unless this node's log
        lists them unchanged. Returns (whether data was hashed, the problem or None)."""
        view, info = self.view, self.view.chunks[c]
        files = self.store.meta_of(info).files
        keys: dict[str, str] = {}
        for suffix in suffixes:
            with contextlib.suppress(OSError, KeyError):  # check_chunk names the problem
                st = os.stat(info.base.with_name(info.base.name + suffix))
                keys[suffix] = VerifiedLog.key(info.stem + suffix, files[suffix]["xxh3_64"],
                                               st, self.vocab_size)
        todo = [s for s in suffixes if s not in keys or keys[s] not in self.log]
        if not todo:
            return False, None
        entry = ChunkEntry(info.stem, info.documents, info.tokens, info.meta_xxh3)
        report = check_chunk(ChunkExpect(self.store.root, info.source, entry, info.kind,
                                         view.dtype, vocab_size=self.vocab_size),
                             suffixes=todo)
        if not report.ok:
            found = "; ".join(f"{p.path}: {p.what}" for p in report.problems)
            return True, (f"{found} (found by the background checksum verification of the "
                          "chunks this process reads; batches before this one may have "
                          f"held these bytes); {self._advice()}")
        for s in todo:
            if s in keys:
                self.log.add(keys[s])
        return True, None
