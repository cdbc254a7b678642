"""One iteration of a :class:`~shardwise.read.stream.dataset.StreamDataset`: its schedule,
its prefetch thread, the blocks its consumer holds, and the example dict it builds.

Why its own module: the dataset is configuration and position (what a checkpoint holds);
a run is the machinery one ``iter()`` starts and ``close()`` or a seek stops. Keeping them
apart lets a seek drop a run without touching the position, and keeps each readable.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.poll import Stopped
from shardwise.errors import ConfigError
from shardwise.read.examples import Output, ignore_unmasked
from shardwise.read.guard import torch_worker
from shardwise.read.orders.stream import StreamOrder, block_runs
from shardwise.read.stream.chunk_cache import ChunkCache, read_chunk
from shardwise.read.stream.schedule import Follower, Item, Prefetcher, RankSchedule
from shardwise.world import StreamShare

Example = dict[str, npt.NDArray[Any]]


def first_example(consumed: int, s: int, n_streams: int) -> int:
    """Stream ``s``'s first example at or after global position ``consumed``."""
    return max(0, -(-(consumed - s) // n_streams))


class Run:
    """One read-ahead: the schedule over ``order``'s blocks, the prefetch thread, and what
    the consumer holds; it serves the rank's examples ``j_start`` up to ``until``
    (``None``: to the end; else a skipped range starts there and the consumer starts
    another run past it). It reads the dataset's parts it is given and writes none of
    them: its waits are :meth:`waited`, for the dataset to count once it is closed."""

    def __init__(self, order: StreamOrder, chunk_cache: ChunkCache, share: StreamShare, *,
                 j_start: int, until: int | None = None, poll_interval: float,
                 timeout: float, ahead_chunks: int, name: str) -> None:
        self.order, self.chunk_cache, self.cache = order, chunk_cache, order.cache
        m = len(share.streams)
        self.current: list[Item | None] = [None] * m
        self.j_start, self.until = j_start, until
        self.firsts = [share.first(t) for t in range(m)]
        starts = [first_example(self.j_start, t, m) for t in range(m)]
        self.stop = threading.Event()
        self.follower = Follower(self.cache, poll_interval=poll_interval, timeout=timeout,
                                 stop=self.stop)
        schedule = RankSchedule(order, share.streams, starts, self.follower,
                                firsts=self.firsts, step=share.step, until=until)
        self.prefetcher = Prefetcher(schedule.next, self._load, chunk_cache,
                                     ahead_chunks=ahead_chunks, stop=self.stop, name=name)
        self.closed = False

    def _load(self, item: Item) -> None:
        """On the prefetch thread: pin the block's chunks and locate the item's windows
        in them (its runs: :func:`~shardwise.read.orders.stream.block_runs` of the block's
        window order, as the stream order gave it)."""
        if item.block < 0:
            return
        try:
            for c in item.chunks.tolist():
                if self.stop.is_set():
                    raise Stopped
                item.parts.append(self.chunk_cache.acquire(c, partial(read_chunk,
                                                                      self.cache, c)))
        except BaseException:
            self.release(item)
            raise
        runs = block_runs([len(p) for p in item.parts], item.order[item.offset:],
                          self.order.config.seq_len)
        item.runs, item.first = runs[:3], runs.starts()

    def next(self, t: int, k: int) -> Item | None:
        item = self.prefetcher.get()
        if item is not None and (item.t != t or item.start != k):
            raise RuntimeError(f"stream schedule out of order: expected stream index {t} at "
                               f"{k}, got {item.t} at {item.start}")
        return item

    def release(self, item: Item) -> None:
        for c in item.chunks[: len(item.parts)].tolist():
            self.chunk_cache.release(c)
        item.parts = []

    def waited(self) -> dict[str, float]:
        return {"producer_wait_s": self.follower.waited,
                "consumer_wait_s": self.prefetcher.waited}

    def close(self) -> bool:
        """Stop the thread and release every block; True the first time (the caller
        then counts :meth:`waited`)."""
        if self.closed:
            return False
        self.closed = True
        for item in self.prefetcher.close() + [i for i in self.current if i is not None]:
            self.release(item)
        return True


class Here:
    """A StreamDataset's chunk cache and current run in one process (a
    :class:`~shardwise.concurrency.local.ProcessLocal`: a forked or unpickled copy of the
    dataset starts with neither; its thread and loaded chunks are its parent's)."""

    def __init__(self, chunk_cache_bytes: int) -> None:
        self.chunk_cache = ChunkCache(chunk_cache_bytes)
        self.run: Run | None = None


def finish_examples(rows: npt.NDArray[np.int64], valid: npt.NDArray[np.int64], L: int) -> Example:
    """The example dict (TokenDataset's layout): inputs, labels, loss mask, positions."""
    n = len(rows)
    loss_mask = (np.arange(L)[None, :] + 1 < valid[:, None]).astype(np.float32)
    return {"input_ids": np.ascontiguousarray(rows[:, :L]),
            "labels": ignore_unmasked(np.array(rows[:, 1:]), loss_mask),
            "loss_mask": loss_mask,
            "position_ids": np.broadcast_to(np.arange(L, dtype=np.int64), (n, L)).copy()}


def shaped_examples(rows: npt.NDArray[np.int64], valid: npt.NDArray[np.int64], L: int,
                    output: Output, stored: npt.DTypeLike, keep: tuple[str, ...]) -> Example:
    """The examples of ``rows`` (``valid`` tokens each) in ``output``'s form: a compact batch
    of whole windows straight from the rows (made full and then shrunk, it would cost more
    than the full form); ``keep``: compact keys carried even when trivial."""
    if output.is_default:
        return finish_examples(rows, valid, L)
    if output.compact and (valid == L + 1).all():
        out = {"tokens": rows.astype(output.token_dtype(stored))}
        if "loss_mask" in keep:
            out["loss_mask"] = np.ones((len(rows), L), dtype=np.uint8)
        return out
    return output.shape(finish_examples(rows, valid, L), stored, keep=keep)


def refuse_worker_process() -> None:
    """A StreamDataset is iterated in the main process only (module docs, PyTorch)."""
    if torch_worker() is not None:
        raise ConfigError("StreamDataset must be iterated in the main process: use "
                          "DataLoader(ds, batch_size=None, num_workers=0). Its own prefetch "
                          "thread already reads ahead, and a DataLoader worker would "
                          "iterate a copy whose position ds.state_dict() cannot see (a "
                          "checkpoint would silently restart). For micro-batches pass "
                          "batch_size= to StreamDataset")


__all__ = ["Example", "Here", "Run", "finish_examples", "first_example", "refuse_worker_process",
           "shaped_examples"]
