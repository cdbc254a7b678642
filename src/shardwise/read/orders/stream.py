"""Stream placement as an order part: ``locate(indices)`` → the runs of stored tokens behind
examples of a :class:`~shardwise.read.stream.dataset.StreamDataset`'s global order (any
rank's), in the form every order answers (:class:`~shardwise.read.orders.base.Runs`).

Example ``i`` is example ``k = i // R*`` of stream ``s = i % R*``. The stream's layout
(:class:`~shardwise.read.orders.stream_layout.StreamLayout`: its blocks' window counts, from
chunk token counts) gives its epoch, block ``b`` and place ``r`` in the block's window order
(:func:`~shardwise.plan.stream.window_order`). A block is its chunks in read order
(:func:`~shardwise.plan.stream.block_read_order`) joined, and its window ``w`` is that
join's tokens ``[w·L, w·L + L + 1)``: :func:`block_runs`, which is :func:`window_runs` over
the block's chunk sizes — the window arithmetic of every order, once. This is the one
walker of stream placement: the stream's reader walks the blocks it yields
(:meth:`StreamOrder.place` and :meth:`StreamOrder.block`, from the reader's own layouts:
:class:`~shardwise.read.stream.schedule.RankSchedule`) and reads each block's windows
through :func:`block_runs`; the padding of a finite run is :meth:`StreamOrder.pad_to`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import as_count
from shardwise.concurrency.bounded import Bounded
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError
from shardwise.plan.stream import block_read_order, window_order
from shardwise.read.orders.base import (
    ORDERS,
    PAD,
    IntArray,
    OrderOptions,
    Runs,
    check_indices,
    order_class,
)
from shardwise.read.orders.config import OrderedConfig
from shardwise.read.orders.layout import TokenLayout
from shardwise.read.orders.stream_layout import Layout, StreamLayout, longest_stream_windows
from shardwise.read.orders.windows import WindowOrder, window_runs

BLOCKS_KEPT = 16
STREAM_SHUFFLE = "window"  # the stream's own: a keyed permutation of each block's windows
Where = tuple[int, int, int, int]  # stream, epoch, block, place in the block's window order


@dataclass(frozen=True)
class StreamConfig(Layout, OrderedConfig):
    """What defines a stream order (all of it is fingerprinted): a StreamDataset's keyword
    arguments, its state's fields, what a read config rebuilds it from
    (:mod:`shardwise.read.reader_config`). The fields are :class:`Layout`'s, ``shuffle``,
    the order of a block's windows
    (:func:`~shardwise.read.orders.stream.check_stream_shuffle`), and ``order``, that
    order's own options (:mod:`shardwise.read.orders.config`: ``block_size=`` of
    ``shuffle="block"``)."""

    reader: ClassVar[str] = "StreamDataset"
    shuffle: str = STREAM_SHUFFLE
    order: OrderOptions | None = None

    def __post_init__(self) -> None:
        for name, low in (("seq_len", 1), ("streams", 1), ("block_chunks", 1), ("seed", 0)):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=low,
                                                    error=ConfigError))
        if self.epochs is not None:  # None: cycle forever
            object.__setattr__(self, "epochs", as_count(self.epochs, "epochs", minimum=1,
                                                        error=ConfigError))
        object.__setattr__(self, "shuffle", check_stream_shuffle(self.shuffle))
        self.check_order()

    def state(self) -> dict[str, Any]:
        out = super().state()  # the default shuffle is absent: states from before it fit
        return {k: v for k, v in out.items() if k != "shuffle" or v != STREAM_SHUFFLE}


def check_stream_shuffle(name: Any) -> str:
    """``name`` if it orders a stream block's windows: ``"window"`` (the default, keyed by
    seed, epoch, stream and block), or any registered window order
    (:class:`~shardwise.read.orders.windows.WindowOrder`: ``"none"``, ``"block"``, a new
    one) over the block's windows; ConfigError naming the ones that fit."""
    if name == STREAM_SHUFFLE:
        return name
    if not issubclass(order_class(name), WindowOrder):
        fit = [STREAM_SHUFFLE] + sorted(n for n, c in ORDERS.items() if n != STREAM_SHUFFLE
                                        and issubclass(c, WindowOrder))
        raise ConfigError(f"stream placement orders each block's windows, and "
                          f"shuffle={name!r} orders something else (documents); use one of "
                          f"{fit}")
    return str(name)


def block_runs(sizes: npt.ArrayLike, windows: npt.ArrayLike, seq_len: int) -> Runs:
    """Windows of one block (``sizes``: its chunks' token counts, in read order) as runs
    of stored tokens; a run's ``chunk`` is its chunk's place in the block."""
    cum = np.zeros(len(np.asarray(sizes)) + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    return window_runs(np.asarray(windows, dtype=np.int64), seq_len, int(cum[-1]), cum)


class StreamOrder:
    """The global order of a StreamDataset as runs (see the module docs), over its config
    and its cache's chunk token counts; asked from any thread (it keeps its own stream
    layouts; a reader walking it passes its own)."""

    name = "stream"

    def __init__(self, config: StreamConfig, cache: Any) -> None:
        self.config, self.cache = config, cache
        self._padded = (-1, 0)  # (chunk count, examples per stream of a finite run)
        # the streams' layouts and the blocks read: per process, never pickled
        # (concurrency.local: the one lifecycle)
        self.derived: ProcessLocal[dict[str, Any]] = ProcessLocal(
            self.fresh, name="the stream order's derived state")

    def fresh(self) -> dict[str, Any]:
        """The derived state as a process starts it (:attr:`derived`)."""
        return {"layouts": {}, "blocks": Bounded(BLOCKS_KEPT)}

    def layout(self, s: int) -> StreamLayout:
        """Stream ``s``'s layout as of the cache's current view (it grows in follow mode)."""
        layouts: dict[int, StreamLayout] = self.derived.get()["layouts"]
        sl = layouts.get(s)
        if sl is None:
            sl = layouts[s] = StreamLayout(s, self.config)
        sl.update(self.cache)
        return sl

    def where(self, i: int) -> Where | str:
        """Global example ``i`` → ``(stream, epoch, block, place)``, or ``"pad"`` (a
        padding example of a finite run), ``"end"`` (past it) or ``"unpublished"`` (in a
        block the build has not finished)."""
        s, k = i % self.config.streams, i // self.config.streams
        found = self.place(self.layout(s), k)
        if found is None:
            return "unpublished"
        if isinstance(found, str):
            return found
        epoch, b, r = found
        return s, epoch, b, r

    def place(self, sl: StreamLayout, k: int) -> tuple[int, int, int] | str | None:
        """Example ``k`` of stream ``sl.s`` → ``(epoch, block, place)``, ``"pad"``, ``"end"``,
        or ``None`` (in a block not final yet), by layout ``sl`` (updated by its owner)."""
        return sl.locate(k, self.pad_to() if sl.finished else None)

    def pad_to(self) -> int | None:
        """Examples per stream in a finite run (``epochs=E``) of a finished cache: every
        stream padded to the longest (``E ×`` its windows per epoch), so every stream and
        rank yields the same count; None when endless or still growing. The one padding
        rule of stream placement (counted once per chunk count)."""
        c, cum = self.config, self.cache.cum_tokens
        if c.epochs is None or not self.cache.finished:
            return None
        if self._padded[0] != len(cum):
            self._padded = (len(cum), c.epochs * longest_stream_windows(cum, c))
        return self._padded[1]

    def block(self, s: int, epoch: int, b: int, sl: StreamLayout | None = None
              ) -> tuple[IntArray, IntArray, IntArray]:
        """Block ``b`` of stream ``s`` in ``epoch`` (a final block: the same by every
        layout of the stream; ``sl``: the caller's own, else this order's): its chunks in
        read order, their token counts, and its window order."""
        key = (s, epoch, b)
        blocks = self.derived.get()["blocks"]
        hit: tuple[IntArray, IntArray, IntArray] | None = blocks.get(key)
        if hit is None:
            c, cum = self.config, self.cache.cum_tokens
            sl = sl if sl is not None else self.layout(s)
            chunks = block_read_order(s, b, sl.block_size(b), n_streams=c.streams,
                                      block_chunks=c.block_chunks, seed=c.seed, epoch=epoch)
            order = self.window_order(s, b, int(sl.cum[b + 1] - sl.cum[b]), epoch)
            hit = blocks.put(key, (chunks, cum[chunks + 1] - cum[chunks], order))
        return hit

    def window_order(self, s: int, b: int, n: int, epoch: int) -> IntArray:
        """The order of block ``b``'s ``n`` windows (stream ``s``, ``epoch``) under the
        config's ``shuffle``: the reader and :meth:`locate` both ask here."""
        c = self.config
        if c.shuffle == STREAM_SHUFFLE:
            return window_order(s, b, n, seed=c.seed, epoch=epoch)
        order = order_class(c.shuffle)(TokenLayout.of_windows(n, c.seq_len), seed=c.seed,
                                       options=c.order)
        assert isinstance(order, WindowOrder)  # for mypy: check_stream_shuffle
        return np.asarray(order.window_block(epoch, np.arange(n)), dtype=np.int64)

    def locate(self, indices: npt.ArrayLike) -> Runs:
        """The runs of stored tokens behind global examples ``indices`` (padding, and
        :data:`PAD`: none); IndexError for one past a finite run or not yet published."""
        idx = check_indices(indices)
        groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        for row, i in enumerate(idx.tolist()):
            found = PAD if i == PAD else self.where(i)
            if found in (PAD, "pad"):
                continue
            if isinstance(found, str):
                raise IndexError(f"example {i} of the stream order is {found!r} (past the "
                                 "end of a finite run, or in a block the build has not "
                                 "published yet): it has no stored tokens")
            assert not isinstance(found, int)  # for mypy: PAD went on above
            groups.setdefault(found[:3], []).append((row, found[3]))
        tokens = np.zeros(len(idx), dtype=np.int64)
        parts = [_no_runs()]
        for key, placed in groups.items():
            chunks, sizes, order = self.block(*key)
            rows, places = (np.asarray(col, dtype=np.int64) for col in zip(*placed, strict=True))
            runs = block_runs(sizes, order[places], self.config.seq_len)
            tokens[rows] = runs.tokens
            parts.append((np.repeat(rows, np.diff(runs.starts())), chunks[runs.chunk],
                          runs.offset, runs.length))
        of, chunk, offset, length = (np.concatenate(c) for c in zip(*parts, strict=True))
        by = np.argsort(of, kind="stable")  # runs back in example order
        return Runs(chunk[by], offset[by], length[by], tokens)


def _no_runs() -> tuple[IntArray, IntArray, IntArray, IntArray]:
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty, empty, empty


__all__ = ["STREAM_SHUFFLE", "StreamConfig", "StreamOrder", "block_runs", "check_stream_shuffle"]
