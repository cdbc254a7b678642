"""Checksums once per node, in the background: the node's log of verified chunk files
(:class:`VerifiedLog`) and the queue a background thread drains to hash the files a process
opens (:class:`ChunkVerifier`).

Why its own module: this is the machinery — a file appended by every process of a node, a
background job that is fork- and pickle-safe — and it knows nothing of caches: what one
check does and where the jobs run are given to it. Which checks a reader makes, and when,
is :mod:`shardwise.storage.integrity` (:class:`~shardwise.storage.integrity.CacheChecks`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path

from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import CorruptChunkError
from shardwise.format.confined import APPEND, open_under

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

    ``places``: where to keep it, in order, each a trusted root and the directory under
    it (the cache and its reader directory, then the user's cache directory when that is
    not writable); ``name`` is per cache and per host, so a cache on a shared file system
    gets one log per node. Unwritable everywhere: nothing is recorded, and every process
    verifies on its own. The log is opened by
    :func:`~shardwise.format.confined.open_under`: a log, or a directory above it, that a
    cache ships as a symlink is a :class:`~shardwise.errors.CacheError`, never followed.
    """

    def __init__(self, places: list[tuple[Path, str]], name: str) -> None:
        log = f"{LOG_DIR}/{name}.{socket.gethostname()}.log"
        self.places = [(root, f"{sub}/{log}" if sub else log) for root, sub in places]
        self._seen: set[str] = set()
        self._read: dict[tuple[Path, str], int] = {}

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
        for place in list(self.places):
            try:
                fd = open_under(*place, APPEND)
            except OSError:  # read-only, or not a directory: try the next place
                self.places.remove(place)
                continue
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return

    def _catch_up(self) -> None:
        """Read the lines other processes appended since the last look."""
        for place in self.places:
            try:
                with os.fdopen(open_under(*place, os.O_RDONLY), "rb") as f:
                    f.seek(self._read.get(place, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            self._read[place] = self._read.get(place, 0) + end
            self._seen.update(data[:end].decode(errors="replace").splitlines())


class ChunkVerifier:
    """Hashes the chunk files a process uses, one at a time, on a background thread.

    ``check(chunk, suffixes)`` does the work (the cache's call of
    :func:`~shardwise.storage.chunk_check.check_chunk`, skipping files the node log lists) and
    returns whether it hashed anything and the problem found (or None); ``submit`` runs a
    job on the cache's background threads. :meth:`want` queues a chunk's files on first
    use; the drain job takes them in order and stops at the first damage, which
    :meth:`raise_if_damaged` (called once per batch) raises from then on.

    Fork-safe: the lock, the queue and the running job are a
    :class:`~shardwise.concurrency.local.ProcessLocal`: in a forked child (a DataLoader
    worker) they are made afresh on first use, re-queuing what its parent had not finished
    (the parent's thread does not exist there); the next batch resumes the work.
    Pickle-safe: a copy keeps what was verified and found, not the queue or the lock. At
    interpreter exit the job stops after the file in hand.

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
        # every file wanted so far is verified and intact (read without a lock)
        self.settled = True
        self._here = ProcessLocal(self._drain_here, name="chunk verification")

    def _drain_here(self) -> _Drain:
        """This process's lock and queue: what is wanted and not verified yet."""
        return _Drain(sorted(self._queued - self._done))

    def want(self, chunk: int, suffixes: tuple[str, ...]) -> None:
        """Verify ``chunk``'s files ``suffixes`` in the background (once per process)."""
        key = (chunk, suffixes)
        if key in self._queued:
            return
        d = self._here.get()
        with d.cond:
            self._queued.add(key)
            d.queue.append(key)
            self.settled = False
            self._start(d)

    def _start(self, d: _Drain) -> None:
        """Under the lock: run the drain job unless it runs or nothing waits."""
        if not d.running and d.queue and self.damage is None:
            d.running = True
            self._submit(partial(self._drain, d))

    def _drain(self, d: _Drain) -> None:
        while True:
            with d.cond:
                if (not d.queue or self.damage is not None
                        or not threading.main_thread().is_alive()):
                    d.running = False
                    self.settled = (not d.queue and self.damage is None
                                    and not self._dropped)
                    d.cond.notify_all()
                    return
                key = d.queue[0]
            error: BaseException | None = None
            try:
                hashed, problem = self._check(*key)
            except BaseException as e:  # raised to the reader at its next batch
                error = e
            else:
                self.hashed, self.skipped = self.hashed + hashed, self.skipped + (not hashed)
                error = CorruptChunkError(problem) if problem is not None else None
            with d.cond:
                if d.queue and d.queue[0] == key:
                    d.queue.popleft()
                self._done.add(key)
                self.damage = self.damage or error
                d.cond.notify_all()

    def raise_if_damaged(self) -> None:
        """Raise the damage the background verification found (cheap: no lock, no system
        call); resume work a fork left queued."""
        if self.damage is not None:
            raise self.damage
        d = self._here.get()
        if d.queue and not d.running:
            with d.cond:
                self._start(d)

    def wait(self) -> None:
        """Block until every queued file is verified (or damage is found)."""
        d = self._here.get()
        with d.cond:
            self._start(d)
            while d.running:
                d.cond.wait()

    def stop(self) -> None:
        """Drop what is queued (the job in hand finishes its file); a later :meth:`want`
        of a dropped file queues it again."""
        d = self._here.get()
        with d.cond:
            self._queued.difference_update(d.queue)
            self._dropped = self._dropped or bool(d.queue)
            d.queue.clear()

    def stats(self) -> dict[str, int]:
        return {"hashed": self.hashed, "skipped": self.skipped,
                "queued": len(self._here.get().queue)}


class _Drain:
    """A verifier's lock, queue and running flag in one process."""

    def __init__(self, queue: list[tuple[int, tuple[str, ...]]]) -> None:
        self.cond = threading.Condition()
        self.queue: deque[tuple[int, tuple[str, ...]]] = deque(queue)
        self.running = False


__all__ = ["LOG_DIR", "ChunkVerifier", "Submit", "VerifiedLog"]
