"""What a stream rank reads next, and the background thread that reads it ahead.

Two pieces, over the pure stream layout of :mod:`shardwise.plan.stream`
(:func:`~shardwise.plan.stream.windows_per_block`):

* :class:`RankSchedule` (the rank's blocks in the order its consumer will need
  them, waiting for the producer in follow mode through a :class:`Follower`), walking
  each stream's :class:`~shardwise.read.orders.stream_layout.StreamLayout`. The blocks
  are the ones the stream order yields (:class:`~shardwise.read.orders.stream.StreamOrder`:
  ``place`` and ``block``, the one walker of stream placement, and its padding rule),
  walked by layouts of the schedule's own (they grow on the read-ahead thread).
* :class:`Prefetcher`: the one read-ahead thread
  (:class:`~shardwise.concurrency.readahead.ReadAhead`) walking the schedule: it reads
  each block's chunks into the :class:`~shardwise.read.stream.chunk_cache.ChunkCache`
  and queues it, at most ``ahead_chunks`` chunks and ``max_bytes`` ahead of the consumer.
  No shared memory, no process-wide locks: ``close()`` stops and joins it, and a crash
  leaves nothing behind.

Need order: the consumer takes rank example ``j`` from stream ``t = j % m`` (``m`` streams
on this rank) at stream position ``K = j // m``, so the block of stream ``t`` that starts
at ``K`` is needed at ``j = K·m + t``. The schedule yields blocks sorted by ``(K, t)``::

    m = 2, stream 0 blocks of 3, 2 windows; stream 1 blocks of 2, 4 windows
    need (K, t):  (0,0) (0,1) (2,1) (3,0) (5,0) (6,1) ...
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.poll import wait_until
from shardwise.concurrency.readahead import ReadAhead
from shardwise.errors import ConfigError, ManifestError, ProducerTimeoutError
from shardwise.format.chunk import ChunkKind
from shardwise.format.ledger import JOURNAL_DIR, LEDGER_NAME
from shardwise.format.manifest import MANIFEST_NAME
from shardwise.plan.stream import stream_chunk_tokens, windows_per_block
from shardwise.read.orders.stream_layout import Layout, StreamLayout
from shardwise.read.stream.chunk_cache import ChunkCache, Tokens
from shardwise.storage.cache import Cache
from shardwise.storage.opening import open_cache

IntArray = npt.NDArray[np.int64]


# -- one stream ---------------------------------------------------------------------------
@dataclass
class Item:
    """A run of stream ``t``'s examples ``[start, stop)``: window ``order[offset + i]`` of a
    block (its window order, from the stream order), or padding (``block < 0``). Once
    loaded, ``parts`` are the block's chunks (read order) and ``runs`` its examples' runs
    of their tokens
    (:func:`~shardwise.read.orders.stream.block_runs`; a run's chunk: its place in
    ``parts``), each example's runs from ``first[i]`` (columns as lists: read per row)."""

    t: int
    stream: int
    start: int
    stop: int
    epoch: int = 0
    block: int = -1
    offset: int = 0
    chunks: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    nbytes: int = 0
    order: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    parts: list[Tokens] = field(default_factory=list)
    first: IntArray = field(default_factory=lambda: np.zeros(1, np.int64))
    runs: tuple[IntArray, IntArray, IntArray] = field(default_factory=lambda: (
        np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)))

    def fill(self, row: npt.NDArray[np.int64], i: int, seq_len: int) -> int:
        """Copy example ``i`` into ``row``; return its number of real tokens (0: padding)."""
        if self.block < 0:
            return 0
        a, b = int(self.first[i]), int(self.first[i + 1])
        at, parts = 0, self.parts
        for c, o, n in zip(*(col[a:b].tolist() for col in self.runs), strict=True):
            row[at: at + n] = parts[c][o: o + n]
            at += n
        return at


# -- waiting for the producer -----------------------------------------------------------
class Follower:
    """Waits for a growing cache: ``refresh()`` polled by the one rule of
    :func:`~shardwise.concurrency.poll.wait_until` (10 ms doubling to ``poll_interval``);
    :class:`ProducerTimeoutError` after ``timeout`` seconds in which
    the ledger did not change (a rewrite that publishes nothing visible yet, e.g. a chunk
    of a later segment, still counts as a live producer). ``waited`` sums the seconds
    spent waiting."""

    def __init__(self, cache: Cache, *, poll_interval: float, timeout: float,
                 stop: threading.Event) -> None:
        self.cache, self.poll, self.timeout, self.stop = cache, poll_interval, timeout, stop
        self.waited = 0.0

    def _ledger_stamp(self) -> object:
        """Changes whenever the ledger does: its snapshot or a new journal record."""
        tail = self.cache.tail
        return tail.stamp() if tail is not None else None

    def wait(self, stream: int, what: str) -> None:
        """Return once the cache has grown or finished; raise if the producer went quiet."""
        started = time.monotonic()
        cache = self.cache
        try:
            wait_until(lambda: cache.finished or cache.refresh() or cache.finished,
                       timeout=self.timeout, poll_interval=self.poll, what=what,
                       progress=self._ledger_stamp, stop=self.stop,
                       on_timeout=lambda waited: ProducerTimeoutError(
                           self._message(stream, what, waited)))
        finally:
            self.waited += time.monotonic() - started

    def _message(self, stream: int, what: str, waited: float) -> str:
        root = self.cache.root
        try:  # the snapshot, or the journal's last record
            changed = max(p.stat().st_mtime for p in (root / LEDGER_NAME, root / JOURNAL_DIR)
                          if p.exists())
            age = f"{time.time() - changed:.1f} s ago"
        except (OSError, ValueError) as e:
            age = f"unknown ({e})"
        return (f"{root}: stream {stream} waited {waited:.1f} s for {what}, and nothing new "
                f"was published for timeout={self.timeout:g} s (the cache has "
                f"{len(self.cache.chunks)} visible chunks and is not finished; {LEDGER_NAME} "
                f"last changed {age}). Is the build still running? Rerun it (it resumes from "
                "the ledger), or raise timeout= if chunks take longer to publish")


def open_when_ready(path: Path, poll: float, timeout: float, *, verify: bool = True
                    ) -> Cache:
    """Open ``path``, waiting (follow mode) for a build to create its manifest and ledger."""
    def opened() -> Cache | None:
        try:
            return open_cache(path, verify=verify)
        except ManifestError:
            if (path / MANIFEST_NAME).exists() and (path / LEDGER_NAME).exists():
                raise  # a cache is there, and it is damaged
            return None

    return wait_until(opened, timeout=timeout, poll_interval=poll, what="a cache",
                      on_timeout=lambda waited: ProducerTimeoutError(
                          f"{path}: no shardwise cache appeared within timeout={timeout:g} "
                          "s; is the build running and writing there?"))


# -- the rank's schedule ----------------------------------------------------------------
class RankSchedule:
    """This rank's blocks (and padding runs) in need order; ``next()`` may wait for the
    producer. The rank takes examples ``firsts[t] + u·step`` of its ``t``-th stream
    (``step`` > 1 when several ranks share a stream: :class:`~shardwise.world.StreamShare`),
    needed at its example ``u·len(streams) + t``; ``starts[t]`` is the first such ``u``.
    ``until``: the schedule ends before the rank's example ``until`` (a skipped range
    starts there: :mod:`~shardwise.read.stream.skipping`), so none of it is read ahead.
    ``order``: the stream order whose blocks it walks (a ``StreamOrder``)."""

    def __init__(self, order: Any, streams: list[int], starts: list[int],
                 follower: Follower, *, firsts: list[int] | None = None,
                 step: int = 1, until: int | None = None) -> None:
        self.order, self.streams, self.follower = order, streams, follower
        self.cache, self.lay = order.cache, order.config
        self.layouts = [StreamLayout(s, self.lay) for s in streams]
        self.firsts, self.step, self.until = firsts or [0] * len(streams), step, until
        self.heap = [(u, t) for t, u in enumerate(starts)]
        heapq.heapify(self.heap)

    def next(self) -> Item | None:
        """The next item the consumer will need, or ``None`` when every stream ended (or
        the next one is needed at ``until`` or later)."""
        while self.heap:
            u, t = heapq.heappop(self.heap)
            if self.until is not None and u * len(self.streams) + t >= self.until:
                return None
            item = self._item(t, self.firsts[t] + u * self.step)
            if item is not None:  # next needed: the first firsts[t] + u'·step >= stop
                heapq.heappush(self.heap, (-(-(item.stop - self.firsts[t]) // self.step), t))
                return item
        return None

    def _item(self, t: int, k: int) -> Item | None:
        sl, s, lay = self.layouts[t], self.streams[t], self.lay
        while True:
            sl.update(self.cache)
            where = self.order.place(sl, k)
            if where is not None:
                break
            b = sl.final_chunks // lay.block_chunks
            need = s + (sl.final_chunks + lay.block_chunks - 1) * lay.streams
            self.follower.wait(s, f"block {b} of its chunks (the last is global chunk "
                                  f"{need}) to be published")
        if where == "end":
            return None
        if where == "pad":
            return Item(t, s, k, self.order.pad_to())
        assert not isinstance(where, str)  # for mypy
        epoch, b, offset = where
        chunks, sizes, order = self.order.block(s, epoch, b, sl)
        nbytes = int(sizes.sum()) * self.cache.dtype.itemsize
        return Item(t, s, k, k + len(order) - offset, epoch, b, offset, chunks, nbytes,
                    order=order)


def check_stream_cache(c: Cache, cfg: Layout, follow: bool) -> None:
    """A ConfigError naming why ``c`` cannot be read under stream layout ``cfg``: not a
    token cache, still being built (without ``follow``), or a stream that cannot cycle."""
    if c.manifest is not None and c.manifest.chunk_kind != ChunkKind.TOKENS.value:
        raise ConfigError(f"{c.root}: a {c.manifest.chunk_kind} cache has no token "
                          "stream; stream placement packs token chunks")
    if not c.finished and not follow:
        raise ConfigError(f"{c.root}: the cache is still being built ({len(c.chunks)} "
                          "chunks visible); pass follow=True to read it as it grows in "
                          "its final order, or wait for the build to finish")
    if c.finished and cfg.epochs is None:
        empty = [s for s in range(cfg.streams) if not windows_per_block(
            stream_chunk_tokens(c.cum_tokens, s, cfg.streams), cfg.block_chunks,
            cfg.seq_len, cfg.drop_last).any()]
        if empty:
            raise ConfigError(f"{c.root}: streams {empty[:8]} hold no window of seq_len "
                              f"+ 1 = {cfg.seq_len + 1} tokens ({len(c.chunks)} chunks "
                              f"over {cfg.streams} streams), so they cannot cycle; use "
                              "fewer streams, a smaller seq_len, or epochs=1 (a single "
                              "pass, padded)")


# -- the thread ---------------------------------------------------------------------------
class Prefetcher:
    """The stream's read-ahead: ``next_item`` + ``load`` on one
    :class:`~shardwise.concurrency.readahead.ReadAhead` thread, loaded items queued in order.

    It reads ahead while fewer than ``ahead_chunks`` chunks are queued and the pinned bytes
    stay within the cache's ``max_bytes``; the next item is always read once the queue is
    empty, so the consumer never starves (memory is then the consumer's blocks plus one).
    Errors on the thread are re-raised by :meth:`get`. ``waited`` is the consumer's time
    blocked in :meth:`get`.
    """

    def __init__(self, next_item: Callable[[], Item | None], load: Callable[[Item], None],
                 chunk_cache: ChunkCache, *, ahead_chunks: int, stop: threading.Event,
                 name: str) -> None:
        self.cc, self.ahead = chunk_cache, ahead_chunks
        self.ra: ReadAhead[Item] = ReadAhead(
            lambda: iter(next_item, None), name=name, admit=self._room, prepare=load,
            lock=chunk_cache.changed, stop=stop, closed_message=(
                "this stream iterator was stopped by close() or load_state_dict(); call "
                "iter() again"))
        self.ra.start()

    @property
    def waited(self) -> float:
        return self.ra.waited

    def _room(self, item: Item, queued: Sequence[Item]) -> bool:
        """Under the chunk cache's lock: may ``item`` be loaded now?"""
        queued_chunks = sum(len(i.chunks) for i in queued)
        return (queued_chunks + len(item.chunks) <= self.ahead
                and self.cc.pinned_bytes + item.nbytes <= self.cc.max_bytes)

    def get(self) -> Item | None:
        """The next loaded item (``None``: the schedule ended); blocks until it is ready."""
        return self.ra.get(None)

    def close(self) -> list[Item]:
        """Stop and join the thread; return the items still queued (to release them)."""
        return self.ra.close()
