"""A batch's runs read by ranged GETs while their chunks are still arriving.

Why: a chunk of 64 MB takes ``latency + 64 MB / bandwidth`` to download (0.7 s at 50 ms
and 100 MB/s), and a shuffled batch reads a few KB from each of several chunks. Waiting for
whole chunks makes the first batch cost the slowest of them; asking for just the batch's
bytes costs one round trip (all ranges at once), while the whole chunks keep downloading
for the batches after::

    batch 1   chunks 3, 7, 9 not here:  GET 3.bin bytes a-b, 7.bin c-d, 9.bin e-f  (~1 RTT)
              whole 3.bin, 7.bin, 9.bin downloading ahead (started by prefetch)
    batch k   3.bin here: its runs from the map; 7.bin still arriving: ranged GET

Integrity, before the bytes are used: a ``.bin``'s metadata holds the xxh3-64 of each of
its 64 KiB blocks (:func:`~shardwise.format.checksum.block_checksums`; the metadata itself
is checked against the ledger). A run is read as the whole blocks around it, runs of one
chunk sharing blocks in one range, and every block is checked against its sum before the
run is cut out of it: bytes a store got wrong are a
:class:`~shardwise.errors.CorruptChunkError` naming the URL and the block, raised by the
batch that would have read them. A chunk an older build wrote has no block sums: a
verifying reader waits for its whole (checked) file instead; one opened with
``verify=False`` reads just the runs' bytes.

Early (:class:`EarlyReads`): a reader that hands over the runs of its coming batches
(``prefetch_runs``, the loader's look-ahead) has their ranged GETs started then, on
threads, as many batches ahead as the measured round trip needs at the reader's pace
(:meth:`EarlyReads.depth`), so a batch read while its chunks arrive waits for nothing: its
bytes were asked for a few batches earlier (a round trip of 50 ms is hidden behind three
batches of 20 ms)::

    prefetch_runs(b0..b7)   GET b0 … GET b7 at once          (the first batch: one round trip)
    gather(b0)              b0's answer                       prefetch_runs(b8): GET b8
    gather(b1)              b1's answer, arrived meanwhile    prefetch_runs(b9): GET b9 …
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency import ThreadPool
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import CorruptChunkError
from shardwise.format.checksum import decode_block_checksums, first_bad_block
from shardwise.format.chunk import ChunkMeta
from shardwise.remote.client import RemoteStore


@dataclass(frozen=True)
class BlockSums:
    """What checks ranged reads of one ``.bin``: its size, block size and block sums."""

    size: int
    block: int
    sums: npt.NDArray[np.uint64]

    @classmethod
    def of(cls, meta: ChunkMeta) -> BlockSums | None:
        """From a chunk's metadata; None if its build wrote no block sums."""
        spec = meta.files.get(".bin", {})
        if "block_xxh3_64" not in spec:
            return None
        try:
            sums, block, size = (decode_block_checksums(spec["block_xxh3_64"]),
                                 int(spec["block_bytes"]), int(spec["bytes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptChunkError(f"{meta.stem}.json: its .bin's block sums are not "
                                    f"valid ({e})") from e
        if block < 1 or len(sums) != -(-size // block):
            raise CorruptChunkError(f"{meta.stem}.json: {len(sums)} block sums of "
                                    f"{block} bytes for a .bin of {size} bytes")
        return cls(size, block, sums)


def _spans(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` merged where they overlap or touch, in order."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class Arriving:
    """The ranged reads of one process: how many, how long a batch's take, and how long
    the reader spends on a batch itself (``own_s``: from handing one batch over to asking
    for the next, its waits excluded).

    Whether ranged reads serve the reader at all (:meth:`serves`): they bring its batches
    at most :data:`MAX_DEPTH` per round trip (that many batches' GETs at once); a reader
    faster than that waits either way, and then each ranged batch only takes the link
    from the downloads that end every wait (its 64 KiB blocks cost about 16 times the
    bytes a batch uses), so it waits for the whole chunks instead::

        rtt 0.08 s, 8 batches per round trip: 10 ms a batch
        a training step of 20 ms per batch   →  ranged reads (it never waits)
        a bench reading flat out, 0.2 ms     →  the downloads at full rate, one wait
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.reads = 0  # runs a batch took from ranged GETs so far
        self.read_bytes = 0  # bytes ranged GETs received (whole blocks)
        self.rtt_s: float | None = None  # how long one batch's ranged GETs take
        self.least_rtt_s: float | None = None  # the quickest (no queue, no start-up)
        self.own_s: float | None = None  # the reader's own time per batch
        self.skipped = 0  # batches that waited for their chunks instead (:meth:`serves`)
        self._handed: float | None = None  # when the reader last got a batch from gather
        self.by_caller = False  # own_s is measured where the caller trains (:meth:`paced`)

    def asked(self) -> float:
        """The reader asks for a batch now: the time since it got the last one was its
        own. Returns the clock (for :meth:`handed`)."""
        now = self.clock()
        if self._handed is not None and not self.by_caller:
            self._own(now - self._handed)
        return now

    def paced(self, own: float | None) -> None:
        """The caller's own time on its last batch, measured where it trains (None: from
        now on, only so). Batches made ahead on a thread (``read/loader.made_ahead``) are
        asked for as the thread's queue empties — back to back while the thread is behind
        — so the time between a gather and the next is not the reader's pace there: a
        thread that asked again at once read as a reader flat out, and every batch then
        waited for whole chunks (a 2 s wait in a 20 ms step)."""
        self.by_caller = True
        if own is not None:
            self._own(own)

    def _own(self, own: float) -> None:
        own = max(own, 1e-6)
        self.own_s = own if self.own_s is None else 0.7 * self.own_s + 0.3 * own

    def handed(self) -> None:
        """The reader got its batch now."""
        self._handed = self.clock()

    def serves(self) -> bool:
        """Whether ranged reads keep up with the reader (see the class doc): its own time
        per batch at least the round trip over :data:`MAX_DEPTH` (the quickest round trip
        seen, the first wave's left out: they wait behind connections opening and
        downloads starting);
        yes until both are measured (the first batches are always read by ranged GETs)."""
        if self.own_s is None or self.least_rtt_s is None:
            return True
        return self.own_s * MAX_DEPTH >= self.least_rtt_s

    def stats(self) -> dict[str, object]:
        return {"ranged_skipped": self.skipped, "ranged_rtt_s": self.rtt_s,
                "ranged_least_rtt_s": self.least_rtt_s, "reader_own_s": self.own_s,
                "reader_paced_by_caller": self.by_caller}

    def worth(self, etas: list[float]) -> bool:
        """Whether to read a batch by ranged GETs rather than wait for its chunks, whose
        downloads are expected to end in ``etas`` seconds (infinite: not measured yet):
        yes unless every one of them lands within two of the batch's round trips (then
        waiting costs less, and ranged GETs would only take bandwidth from the
        downloads)."""
        rtt = self.rtt_s if self.rtt_s is not None else 0.05
        return any(e > 2 * rtt for e in etas)

    def fetch(self, remote: RemoteStore, runs: list[tuple[str, int, int]],
              sizes: dict[str, int], block: int) -> Fetched:
        """The bytes ``[start, stop)`` of each run ``(stem, start, stop)`` of a ``.bin`` of
        ``sizes[stem]`` bytes, all asked for at once: the whole ``block``-byte blocks
        around them (0: just their bytes), runs of one file sharing blocks in one range.
        Nothing is checked yet (:meth:`Fetched.check`: the block sums may still be on
        their way)."""
        wanted: dict[str, list[tuple[int, int]]] = {}
        for stem, a, b in runs:
            if block:
                a, b = a // block * block, min(-(-b // block) * block, sizes[stem])
            wanted.setdefault(stem, []).append((a, b))
        spans = [(stem, a, b) for stem, rs in wanted.items() for a, b in _spans(rs)]
        started, first_wave = time.monotonic(), self.rtt_s is None
        got = remote.get_ranges([(stem + ".bin", a, b) for stem, a, b in spans], checked=True)
        took = time.monotonic() - started
        self.rtt_s = took if self.rtt_s is None else 0.7 * self.rtt_s + 0.3 * took
        if not first_wave:  # those started before any answer wait for connections
            self.least_rtt_s = min(took, self.least_rtt_s or took)
        self.read_bytes += sum(b - a for _, a, b in spans)
        return Fetched(remote, block, spans, got)


@dataclass
class Fetched:
    """What one batch's ranged GETs returned: ``(stem, start, stop)`` spans (whole blocks
    of ``block`` bytes; 0: exact) and each one's answer."""

    remote: RemoteStore
    block: int
    spans: list[tuple[str, int, int]]
    got: list[bytes | Exception]

    def check(self, sums: dict[str, BlockSums | None]) -> set[str]:
        """The files whose bytes may be used: every span whole, and each block of a file
        with sums in ``sums`` matching its sum (else :class:`CorruptChunkError`); a file
        whose sums are None is used unchecked (not verifying); one missing from ``sums``,
        or read in other blocks than its sums', is not used (it is read whole instead)."""
        usable = set()
        for (stem, a, b), data in zip(self.spans, self.got, strict=True):
            if stem not in sums:
                continue
            s = sums[stem]
            if s is not None and s.block != self.block:
                continue
            _check(self.remote, stem + ".bin", a, b, data, s)
            usable.add(stem)
        return usable

    def tokens(self, stem: str, start: int, stop: int, dtype: np.dtype[Any]
               ) -> npt.NDArray[Any]:
        """The run's tokens (bytes ``[start, stop)`` of the file), out of its span."""
        for (s, a, _), data in zip(self.spans, self.got, strict=True):
            if s == stem and isinstance(data, bytes) and a <= start and stop <= a + len(data):
                return np.frombuffer(data[start - a:stop - a], dtype=dtype)
        raise AssertionError(f"{stem}.bin: no span holds bytes [{start}, {stop})")


def _check(remote: RemoteStore, key: str, a: int, b: int, data: bytes | Exception,
           sums: BlockSums | None) -> None:
    """A ranged GET's answer: all of ``[a, b)``, each block matching its sum."""
    url = remote.url_of(key)
    if isinstance(data, FileNotFoundError):
        raise CorruptChunkError(f"{url}: named by the ledger but missing; run 'shardwise "
                                f"verify {remote.url}'")
    if isinstance(data, Exception):
        raise data
    if len(data) != b - a:
        raise CorruptChunkError(f"{url}: a ranged GET of bytes [{a}, {b}) returned "
                                f"{len(data)} bytes; run 'shardwise verify {remote.url}'")
    if sums is None:
        return
    bad = first_bad_block(data, a // sums.block, sums.sums, sums.block)
    if bad >= 0:
        raise CorruptChunkError(
            f"{url}: a ranged GET returned bytes of block {bad} (bytes "
            f"[{bad * sums.block}, {min((bad + 1) * sums.block, sums.size)})) whose xxh3_64 "
            "is not the one its metadata records: the store answered with wrong bytes (none "
            "was used); retry, and check the store or the network between")


DEPTH = 8  # batches whose ranged GETs run ahead of the reader before anything is measured
MAX_DEPTH = 8  # each a GET per window of a shuffled batch: connections
MAX_QUEUED = 64  # batches handed over whose reads wait for their turn


class EarlyReads:
    """The ranged reads of coming batches, started before the reader asks (see the module
    doc), keyed by their runs: :meth:`start` on a handed-over batch, :meth:`take` when it
    is read. At most :meth:`depth` run or wait to be taken at once, the others queued in
    the order handed over (:data:`MAX_QUEUED` at most); a reader that skipped batches
    leaves theirs behind, dropped when a later one is taken. A forked child forgets its
    parent's."""

    def __init__(self) -> None:
        self._here = ProcessLocal(_Pending, name="early reads")  # this process's (.local)
        self.started = self.used = 0  # reads started early; those a batch then used
        self.rtt_s: float | None = None  # how long one batch's early read takes
        self.slow_s: float | None = None  # the slowest lately (a fading maximum)
        self.own_s: float | None = None  # the reader's own time per batch, as last taken

    @staticmethod
    def key(chunk: npt.NDArray[np.int64], offset: npt.NDArray[np.int64],
            length: npt.NDArray[np.int64]) -> bytes:
        return b"".join(np.ascontiguousarray(a, dtype=np.int64).tobytes()
                        for a in (chunk, offset, length)) + len(chunk).to_bytes(8, "little")

    @property
    def _pending(self) -> OrderedDict[bytes, Future[Any] | Callable[[], Any]]:
        return self._here.get().reads

    @property
    def meta_lock(self) -> threading.Lock:
        """One fetch of the chunks' metadata at a time (in this process)."""
        return self._here.get().meta_lock

    def depth(self) -> int:
        """Batches to read ahead: twice the round trip (or the slowest recent one, if
        longer: a loaded store's answers come late now and then, and a wait over 50 ms is
        what the early read is for) over the reader's own time per batch, plus one
        (:data:`DEPTH` until both are measured), at most :data:`MAX_DEPTH`::

            rtt 0.06 s, a batch every 0.02 s   →   2 × 3 + 1 = 7 batches ahead
            rtt 0.06 s, one of 0.35 s lately, a batch every 0.045 s  →  7 + 1 = 8
        """
        if self.rtt_s is None or not self.own_s:
            return DEPTH
        ahead = max(2 * self.rtt_s, self.slow_s or 0.0) / self.own_s
        return max(2, min(MAX_DEPTH, int(ahead) + 1))

    def due_s(self) -> float | None:
        """Seconds until the reader gets to a batch handed over now: after those read
        ahead already, one per the reader's own time per batch (None: not measured yet)."""
        if self.own_s is None:
            return None
        return (len(self._pending) + 1) * self.own_s

    def wants_more(self) -> bool:
        """Fewer batches are read ahead than :meth:`depth` asks for."""
        return len(self._pending) < self.depth()

    def _timed(self, job: Callable[[], Any]) -> Any:
        started = time.monotonic()
        out = job()
        took = time.monotonic() - started
        self.rtt_s = took if self.rtt_s is None else 0.7 * self.rtt_s + 0.3 * took
        self.slow_s = max(took, 0.9 * (self.slow_s or 0.0))  # fades over ~20 reads
        return out

    def start(self, key: bytes, job: Callable[[], Any]) -> None:
        """Start ``job`` (the ranged read of the batch ``key``), or queue it while
        :meth:`depth` batches' reads run ahead already: a look-ahead that hands over
        hundreds of batches (downloads that want more) must not start hundreds of reads,
        whose answers would take the link and arrive long before (or after) their use.
        At most :data:`MAX_QUEUED` wait; a batch beyond them is read when it is read."""
        if key in self._pending or len(self._pending) >= MAX_QUEUED:
            return
        self._pending[key] = job
        self._fill()

    def _fill(self) -> None:
        """Start the queued reads, oldest first, while fewer than :meth:`depth` run."""
        for key, entry in list(self._pending.items())[:self.depth()]:
            if not isinstance(entry, Future):
                self._pending[key] = self._pool_submit(entry)

    def take(self, key: bytes, own_s: float | None = None) -> Future[Any] | None:
        """The read for ``key`` (started now if it was queued; None: none); those handed
        over before it are dropped (a queued one never starts). ``own_s``: the reader's
        own time per batch, its waits excluded (:class:`Arriving`), the pace the depth
        and the due times follow. Not the time between takes: that holds the waits, so a
        reader that waited read as a slow one and was read for less far ahead — a first
        batch's 0.2 s wait kept the depth at 2–3 for the next ten batches, each of which
        then waited 10–45 ms in a 20 ms step."""
        if own_s is not None:
            self.own_s = own_s
        if key not in self._pending:
            return None
        while True:
            k, entry = self._pending.popitem(last=False)
            if k != key:
                if isinstance(entry, Future):
                    entry.cancel()
                continue
            if not isinstance(entry, Future):
                entry = self._pool_submit(entry)
            self.used += 1
            self._fill()
            return entry

    def _pool_submit(self, job: Callable[[], Any]) -> Future[Any]:
        self.started += 1
        return self._here.get().pool.submit(partial(self._timed, job))

    def close(self) -> None:
        self._here.close()


class _Pending:
    """The early reads of one process: a forked child forgets its parent's (their threads
    are not there), a pickled copy carries none."""

    def __init__(self) -> None:
        self.reads: OrderedDict[bytes, Future[Any] | Callable[[], Any]] = OrderedDict()
        self.pool = ThreadPool(MAX_DEPTH, name="shardwise-ranged")  # no thread until used
        self.meta_lock = threading.Lock()

    def close(self) -> None:
        self.pool.close()


__all__ = ["DEPTH", "MAX_DEPTH", "MAX_QUEUED", "Arriving", "BlockSums", "EarlyReads", "Fetched"]
