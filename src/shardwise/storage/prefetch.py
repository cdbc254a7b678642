"""Downloading ahead of a reader: as far ahead as the measured latency needs, within
``local_bytes``.

Why: on an object store every request costs a round trip before its first byte (tens of
milliseconds), and a reader at local speed uses a chunk in a few. A fixed look-ahead is
wrong both ways: too short and the reader waits on every chunk, too long and the local
copy fills with chunks read minutes later. So two figures are measured as the run goes
(:class:`Pace`) and the look-ahead follows them:

* ``fetch_s``: how long one chunk file takes to download (latency + transfer, as the
  downloads actually ran, concurrency included);
* ``read_s``: how long the reader spends on one chunk before it needs the next new one
  (time it waited for a download excluded: a stalled reader must not look slow).

During one download the reader gets through ``fetch_s / read_s`` chunks, so that many
must already be on their way; the look-ahead is twice that (a margin for jitter) plus
one, and that many downloads run at once::

    fetch_s = 0.060 s, read_s = 0.010 s   →   6 chunks per download   →   13 ahead, 12 threads
    fetch_s = 0.005 s, read_s = 0.010 s   →   0.5                     →    2 ahead (minimum)

The look-ahead is bounded in bytes by what the pace needs in flight — the read rate
(``chunk_bytes / read_s``) times ``fetch_s``, twice over, plus one chunk: that is
``chunks_ahead × chunk_bytes`` (:func:`in_flight_budget`) — within the room ``local_bytes``
leaves beside the chunks the reader holds mapped. Sizing ``local_bytes``: the chunks an
order reads at once (a window shuffle over the whole cache: all of them; a block shuffle:
a group's) plus that in-flight need; the default 8 GiB serves
64 MB chunks at 50 ms and 100 MB/s (``fetch_s`` ≈ 0.7 s) up to a read rate of about
2.8 GB/s of chunk bytes with a 2 GiB working set. A chunk downloaded ahead is **pinned**
until the reader takes it: its modification time is set in the future, and the download
directory (:class:`~shardwise.storage.download.DownloadDir`) never evicts a file whose
time has not come, so a chunk is never evicted before it is read. A pin lapses after
:data:`PIN_SECONDS` (a reader that stopped early leaves nothing pinned for long); a
download the reader needs *now* may, as a last resort, evict a pinned file rather than
wait forever on a node whose processes pinned all of it.

State (``stats()``): ``ahead`` (chunks downloading or downloaded and not yet read),
``ahead_bytes``, ``target`` (chunks the pace asks for), ``threads``, ``fetch_s``,
``read_s``, ``waited_s`` (seconds the reader waited for downloads).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path

from shardwise.concurrency import ThreadPool
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import RemoteError

MIN_AHEAD = 2
START_AHEAD = 4  # before anything is measured
MAX_AHEAD = 256
MAX_THREADS = 16
MARGIN = 2.0
PIN_SECONDS = 120.0
STALE = 4.0
_WEIGHT = 0.3  # of the newest sample in the running averages
_HIT_S = 0.005  # a "download" this fast found the file on the node: not a sample


class Pace:
    """Measured download time and reading time per chunk → how many chunks to keep
    downloading ahead. ``clock`` is injectable (tests use a fake one).

    >>> p = Pace(clock=lambda: 0.0)
    >>> p.fetched(0.06); p.read(0.01); p.chunks_ahead()
    13
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.fetch_s: float | None = None
        self.read_s: float | None = None
        self._last: float | None = None  # when the reader last got a new chunk

    @staticmethod
    def _average(old: float | None, new: float) -> float:
        return new if old is None else (1 - _WEIGHT) * old + _WEIGHT * new

    def fetched(self, seconds: float) -> None:
        """One chunk file took ``seconds`` to download."""
        if seconds >= _HIT_S:
            self.fetch_s = self._average(self.fetch_s, seconds)

    def read(self, seconds: float) -> None:
        """The reader spent ``seconds`` (waits excluded) on a chunk before the next."""
        self.read_s = self._average(self.read_s, max(seconds, 1e-6))

    def taken(self, asked: float) -> None:
        """The reader asked for a new chunk at ``asked`` (clock time) and has it now: the
        time since it got the previous one, up to ``asked``, was spent reading."""
        if self._last is not None:
            self.read(asked - self._last)
        self._last = self.clock()

    @property
    def reading(self) -> bool:
        """Whether a reader in this process has taken a chunk yet."""
        return self._last is not None

    def window_s(self) -> float:
        """How long a chunk should wait between being handed over and being read (the
        look-ahead's length in time, plus its download); ``PIN_SECONDS`` until known."""
        if self.fetch_s is None or self.read_s is None:
            return PIN_SECONDS
        return self.chunks_ahead() * self.read_s + self.fetch_s

    def per_download(self) -> float | None:
        """Chunks the reader gets through during one download (None: not measured yet)."""
        if self.fetch_s is None or self.read_s is None:
            return None
        return self.fetch_s / self.read_s

    def chunks_ahead(self) -> int:
        """How many chunks to have downloading or downloaded ahead of the reader."""
        need = self.per_download()
        if need is None:
            return START_AHEAD
        return max(MIN_AHEAD, min(MAX_AHEAD, math.ceil(need * MARGIN - 1e-9) + 1))

    def threads(self) -> int:
        """How many downloads to run at once."""
        return max(2, min(MAX_THREADS, self.chunks_ahead() - 1))


def in_flight_budget(local_bytes: int, held: int, pace: Pace, chunk_bytes: int) -> int:
    """Bytes that may be downloading ahead: what the measured pace needs in flight
    (``chunks_ahead × chunk_bytes`` = twice the read rate times ``fetch_s``, plus a chunk;
    :data:`START_AHEAD` chunks before anything is measured) as far as the room
    ``local_bytes`` leaves beside the ``held`` bytes of the chunks being read allows, and
    never less than half of ``local_bytes`` (the budget before; a reader's maps may
    outlive their evicted files, so ``held`` may overstate what the disk holds).

    >>> p = Pace(clock=lambda: 0.0); p.fetched(0.7); p.read(0.07)  # 10 chunks per download
    >>> in_flight_budget(1 << 30, 0, p, 64 << 20) // (64 << 20)    # 2 × 10 + 1, within 16
    16
    >>> in_flight_budget(2 << 30, 0, p, 64 << 20) // (64 << 20)    # not half: 21 chunks
    21
    >>> in_flight_budget(2 << 30, 1536 << 20, p, 64 << 20) // (64 << 20)  # half, at least
    16
    """
    need = pace.chunks_ahead() * chunk_bytes
    return max(local_bytes // 2, min(local_bytes - held, need))


Fetch = Callable[[float | None], Path]
GetMany = Callable[[list[str]], "dict[str, bytes | Exception]"]
SMALL_BATCH = 64  # small objects fetched in one round trip at most


class Prefetcher:
    """A reader's downloads ahead, at most ``budget`` bytes (with ``held``: the reader's
    mapped bytes, the budget is :func:`in_flight_budget` of ``budget`` = ``local_bytes``):
    started by :meth:`add`, collected by :meth:`take`. A ``fetch(pin_until)`` downloads
    (or finds on the node) one file and returns its local path, pinned until
    ``pin_until`` (wall-clock seconds; None: used now)."""

    def __init__(self, budget: int, *, held: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._held = held
        self._sizes = [0, 0]  # bytes and files handed over: the mean chunk
        self.pace = Pace(clock)
        self.waited_s = 0.0
        self._added_bytes = 0
        # this process's downloads (.local): a forked child (a DataLoader worker) inherits
        # the pending downloads but not the threads that finish them, and a pickled copy
        # carries none; either forgets them and fetches what it reads
        self._here = ProcessLocal(_Downloads, name="downloads ahead")

    # -- this process's downloads ---------------------------------------------------------
    @property
    def _ahead(self) -> dict[str, tuple[int, Future[Path], float]]:
        return self._here.get().ahead

    @property
    def _waiting(self) -> dict[str, tuple[int, Fetch, float]]:
        return self._here.get().waiting

    def same_as_last(self, handed: list[int]) -> bool:
        """Whether the reader hands over the same chunks as in its previous call (the
        batches of one block mostly do): they are ahead, queued or read already, and the
        call need not look at each again (it runs on the reader's thread, every batch)."""
        here = self._here.get()
        if handed == here.last_handed:
            return True
        here.last_handed = handed
        return False

    @property
    def ahead_bytes(self) -> int:
        return sum(entry[0] for entry in self._ahead.values())

    def room(self) -> int:
        """The bytes downloads ahead may take now."""
        if self._held is None:
            return self.budget
        chunk = self._sizes[0] // max(1, self._sizes[1])
        return in_flight_budget(self.budget, self._held(), self.pace, chunk)

    def wants_more(self, left: int | None = None) -> bool:
        """Whether the reader's coming chunks should be handed over sooner: fewer are
        ahead than the pace asks for and than the ``left`` chunks to fetch (a cache of
        fewer had its look-ahead hand over 1,024 batches before its first), and there is
        room in the budget."""
        want = min(self.pace.chunks_ahead(), left if left is not None else MAX_AHEAD)
        return (not self._waiting and len(self._ahead) < want
                and self.ahead_bytes < self.room())

    def add(self, key: str, size: int, fetch: Fetch, needs: str | None = None) -> bool:
        """Start downloading ``key`` (``size`` bytes), or, while the budget is full, queue it:
        queued downloads start in the order handed over as the reader takes chunks and
        frees room (a chunk handed over once and refused would otherwise be skipped, and
        the reader would wait a whole round trip for it). True if started (or ahead).
        ``needs``: a small object the download reads first (the chunk's metadata), which
        :meth:`small` fetches together with the other downloads' ones."""
        if key in self._ahead:
            return True
        if key not in self._waiting:
            self._sizes[0] += size
            self._sizes[1] += 1
        self._drop_stale()
        self._forget_done(size)
        self._start_waiting()
        if key not in self._waiting and len(self._waiting) < MAX_AHEAD:
            self._waiting[key] = size, fetch, self.pace.clock()
        if needs is not None:
            self._here.get().wanted[needs] = None
        self._start_waiting()
        return key in self._ahead

    def _start_waiting(self) -> None:
        """Start the queued downloads, oldest first, while they fit in the budget."""
        if not self._waiting:
            return
        room, ahead = self.room(), self.ahead_bytes
        for key, (size, fetch, _) in list(self._waiting.items()):
            if ahead + size > room:
                break
            ahead += size
            del self._waiting[key]
            pool = self._here.get().pool_of(self.pace.threads())
            self._added_bytes += size
            future = pool.submit(partial(self._run, fetch))
            self._ahead[key] = size, future, self.pace.clock()

    def _forget_done(self, size: int) -> None:
        """Make room in the accounting by forgetting the oldest finished downloads when
        the reader is another process (a DataLoader worker: this one has handed over
        twice its budget without taking a chunk, so none would ever leave): their files
        stay pinned on disk, and the worker finds them there. A reader in this process
        takes every chunk it was handed."""
        if self.pace.reading or self._added_bytes <= 2 * self.budget:
            return
        room = self.room()
        for key in list(self._ahead):
            if self.ahead_bytes + size <= room or not self._ahead[key][1].done():
                break
            del self._ahead[key]

    def _drop_stale(self) -> None:
        """Forget (and unpin) downloads ahead that the reader passed by: handed over more
        than ``STALE × window_s`` ago, e.g. by an iteration that was stopped and restarted
        elsewhere. In a healthy run each is read about ``window_s`` after it was handed
        over."""
        now, horizon = self.pace.clock(), STALE * self.pace.window_s()
        for key, (_, _, added) in list(self._waiting.items()):
            if now - added <= horizon:
                break
            del self._waiting[key]
        for key, (_, future, added) in list(self._ahead.items()):
            if now - added <= horizon:
                break
            del self._ahead[key]
            if future.done() and future.exception() is None:
                with contextlib.suppress(FileNotFoundError):
                    os.utime(future.result())

    def small(self, key: str, get_many: GetMany) -> bytes:
        """Small object ``key`` (a chunk's metadata), fetched in one round trip together
        with those the other downloads ahead will need: on a store far away a download
        then costs one round trip, not two (metadata, then data)."""
        here = self._here.get()
        with here.small_lock:  # a download thread that needs one of these waits here
            got = here.small.pop(key, None)
            if got is None:
                batch = [key] + [k for k in list(here.wanted) if k != key][:SMALL_BATCH - 1]
                for k in batch:
                    here.wanted.pop(k, None)
                fetched = get_many(batch)
                got = fetched.pop(key)
                if len(here.small) > 16 * SMALL_BATCH:  # never used: chunks not read
                    here.small.clear()
                here.small.update(fetched)
        if isinstance(got, Exception):
            raise got
        return got

    def _run(self, fetch: Fetch) -> Path:
        """On a download thread: fetch, pin, and time it."""
        started = self.pace.clock()
        path = fetch(time.time() + PIN_SECONDS)
        self.pace.fetched(self.pace.clock() - started)
        return path

    def take(self, key: str, fetch: Fetch, *, new_chunk: bool = True) -> Path:
        """The local path of ``key`` for the reader, unpinned: its download ahead (waited
        for) or a download now. ``new_chunk``: the reader starts on a chunk it had not
        mapped (its reading pace is measured between those)."""
        asked = self.pace.clock()
        entry = self._ahead.pop(key, None)
        self._waiting.pop(key, None)  # needed now: fetched below, not queued
        path = None
        self._drop_stale()
        self._start_waiting()  # room freed: the next queued downloads start now
        if entry is not None:
            future = entry[1]
            error = future.exception()
            if isinstance(error, RemoteError):  # the store had its whole retry budget
                raise error
            if error is None:  # another error is raised by the download below
                path = future.result()
                try:
                    os.utime(path)
                except FileNotFoundError:  # evicted by another process: fetch it again
                    path = None
        if path is None:
            path = fetch(None)
            self.pace.fetched(self.pace.clock() - asked)
        self.waited_s += self.pace.clock() - asked
        if new_chunk:
            self.pace.taken(asked)
        pool = self._here.get().pool
        if pool is not None:
            pool.resize(self.pace.threads())
        return path

    def eta(self, key: str) -> float | None:
        """Seconds until the download of ``key`` is expected to end (its start plus the
        measured ``fetch_s``; 0: ended; infinite: nothing measured yet, or running past
        that: the estimate failed, e.g. the first of several downloads at once set it; or
        never handed over here: another process of the node may be downloading it, or
        nothing asked for it yet); None: queued for room (started as room is freed)."""
        entry = self._ahead.get(key)
        if entry is None:
            return None if key in self._waiting else math.inf
        if entry[1].done():
            return 0.0
        if self.pace.fetch_s is None:
            return math.inf
        left = entry[2] + self.pace.fetch_s - self.pace.clock()
        return left if left > 0 else math.inf

    def wait(self) -> None:
        """Block until every download started so far has finished."""
        for entry in list(self._ahead.values()):
            entry[1].exception()

    def close(self) -> None:
        """Cancel queued downloads and join the running ones (this process's)."""
        self._here.close()

    def stats(self) -> dict[str, object]:
        return {"ahead": len(self._ahead), "ahead_bytes": self.ahead_bytes,
                "target": self.pace.chunks_ahead(), "threads": self.pace.threads(),
                "fetch_s": self.pace.fetch_s, "read_s": self.pace.read_s,
                "waited_s": self.waited_s, "budget": self.room()}


class _Downloads:
    """A prefetcher's downloads in one process (see :class:`Prefetcher`)."""

    def __init__(self) -> None:
        self.ahead: dict[str, tuple[int, Future[Path], float]] = {}  # in the order added
        self.wanted: dict[str, None] = {}  # small objects the downloads ahead will need
        self.waiting: dict[str, tuple[int, Fetch, float]] = {}  # handed over, no room yet
        self.last_handed: list[int] = []
        self.small: dict[str, bytes | Exception] = {}  # fetched with another's, unused yet
        self.small_lock = threading.Lock()
        self.pool: ThreadPool | None = None

    def pool_of(self, threads: int) -> ThreadPool:
        if self.pool is None:
            self.pool = ThreadPool(threads, name="shardwise-download")
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


__all__ = ["PIN_SECONDS", "Pace", "Prefetcher", "in_flight_budget"]
