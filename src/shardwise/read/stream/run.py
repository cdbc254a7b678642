"""One iteration of a :class:`~shardwise.read.stream.dataset.StreamDataset`: its schedule,
its prefetch thread, the blocks its consumer holds, and the example dict it builds.

Why its own module: the dataset is configuration and position (what a checkpoint holds);
a run is the machinery one ``iter()`` starts and ``close()`` or a seek stops. Keeping them
apart lets a seek drop a run without touching the position, and keeps each readable.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.poll import Stopped
from shardwise.read.examples import ignore_unmasked
from shardwise.read.orders.stream import block_runs
from shardwise.read.stream.chunk_cache import Tokens, read_chunk
from shardwise.read.stream.schedule import Follower, Item, Prefetcher, RankSchedule

if TYPE_CHECKING:
    from shardwise.read.stream.dataset import StreamDataset

Example = dict[str, npt.NDArray[Any]]


def first_example(consumed: int, s: int, n_streams: int) -> int:
    """Stream ``s``'s first example at or after global position ``consumed``."""
    return max(0, -(-(consumed - s) // n_streams))


class Run:
    """One read-ahead: the schedule, the prefetch thread, and what the consumer holds; it
    serves the rank's examples ``j_start`` up to ``until`` (``None``: to the end; else a
    skipped range starts there and the consumer starts another run past it)."""

    def __init__(self, ds: StreamDataset, j_start: int, until: int | None = None) -> None:
        cfg, world = ds.config, ds.world
        self.ds = ds
        self.current: list[Item | None] = [None] * len(ds.streams)
        self.j_start, self.until = j_start, until
        m, share = len(ds.streams), ds.share
        self.firsts = [share.first(t) for t in range(m)]
        starts = [first_example(self.j_start, t, m) for t in range(m)]
        self.stop = threading.Event()
        self.follower = Follower(ds.cache, poll_interval=ds.poll_interval,
                                 timeout=ds.timeout, stop=self.stop)
        schedule = RankSchedule(ds.cache, cfg, ds.streams, starts, self.follower,
                                firsts=self.firsts, step=share.step, until=until)
        self.prefetcher = Prefetcher(schedule.next, self._load, ds.chunk_cache,
                                     ahead_chunks=ds.prefetch_chunks, stop=self.stop,
                                     name=f"shardwise-stream-rank{world.rank}")
        self.closed = False

    def _load(self, item: Item) -> None:
        """On the prefetch thread: pin the block's chunks and locate the item's windows
        in them (its runs: :func:`~shardwise.read.orders.stream.block_runs`)."""
        if item.block < 0:
            return
        ds, cfg = self.ds, self.ds.config
        try:
            for c in item.chunks.tolist():
                if self.stop.is_set():
                    raise Stopped
                item.parts.append(ds.chunk_cache.acquire(c, partial(self._read, c)))
        except BaseException:
            self.release(item)
            raise
        n = item.stop - item.start + item.offset
        order = ds.order.window_order(item.stream, item.block, n, item.epoch)
        runs = block_runs([len(p) for p in item.parts], order[item.offset:], cfg.seq_len)
        item.runs, item.first = runs[:3], runs.starts()

    def _read(self, c: int) -> Tokens:
        self.ds.opened[c] += 1
        return read_chunk(self.ds.cache, c)

    def next(self, t: int, k: int) -> Item | None:
        item = self.prefetcher.get()
        if item is not None and (item.t != t or item.start != k):
            raise RuntimeError(f"stream schedule out of order: expected stream index {t} at "
                               f"{k}, got {item.t} at {item.start}")
        return item

    def release(self, item: Item) -> None:
        for c in item.chunks[: len(item.parts)].tolist():
            self.ds.chunk_cache.release(c)
        item.parts = []

    def waited(self) -> dict[str, float]:
        return {"producer_wait_s": self.follower.waited,
                "consumer_wait_s": self.prefetcher.waited}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for item in self.prefetcher.close() + [i for i in self.current if i is not None]:
            self.release(item)
        for k, v in self.waited().items():
            self.ds._waited[k] += v


def finish_examples(rows: npt.NDArray[np.int64], valid: npt.NDArray[np.int64], L: int) -> Example:
    """The example dict (TokenDataset's layout): inputs, labels, loss mask, positions."""
    n = len(rows)
    loss_mask = (np.arange(L)[None, :] + 1 < valid[:, None]).astype(np.float32)
    return {"input_ids": np.ascontiguousarray(rows[:, :L]),
            "labels": ignore_unmasked(np.array(rows[:, 1:]), loss_mask),
            "loss_mask": loss_mask,
            "position_ids": np.broadcast_to(np.arange(L, dtype=np.int64), (n, L)).copy()}


__all__ = ["Example", "Run", "finish_examples", "first_example"]
