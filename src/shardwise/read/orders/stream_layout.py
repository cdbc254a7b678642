"""Where a stream's examples are, from chunk token counts alone: the layout stream
placement plans over (:mod:`shardwise.read.orders.stream`), as pure as a
:class:`~shardwise.read.orders.layout.TokenLayout` but growing with a cache a build is
still writing.

Stream ``s`` owns the chunks ``c % R* == s``, cut into blocks of ``block_chunks``; a block
is final once full, or once the build finished; its windows are counted by
:func:`~shardwise.plan.stream.windows_per_block`::

    stream 1 of 4, blocks of 2:  chunks 1 5 | 9 13 | 17   windows 3 | 4 | 1   cum [0, 3, 7, 8]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError
from shardwise.plan.stream import stream_chunk_tokens, windows_per_block

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Layout:
    """The fields of a stream config that decide the order (see ``StreamConfig``)."""

    seq_len: int
    streams: int
    seed: int = 0
    block_chunks: int = 4
    drop_last: bool = True
    epochs: int | None = None


class StreamLayout:
    """Where stream ``s``'s examples are, from chunk token counts alone.

    ``cum[b]`` counts the windows of the blocks before ``b`` among the *final* blocks (full,
    or the partial last one once the build finished); it grows with the cache.
    """

    def __init__(self, s: int, lay: Layout) -> None:
        self.s, self.lay = s, lay
        self.chunks = 0           # stream chunks visible
        self.final_chunks = 0     # stream chunks in final blocks
        self.cum = np.zeros(1, dtype=np.int64)
        self.finished = False

    def update(self, cache: Any) -> None:
        """Take the chunks ``cache`` shows now (its ``chunks``, ``cum_tokens``, ``finished``)."""
        lay, total = self.lay, len(cache.chunks)
        self.chunks = max(0, (total - self.s + lay.streams - 1) // lay.streams)
        self.finished = cache.finished
        final = self.chunks if cache.finished else self.chunks // lay.block_chunks * (
            lay.block_chunks)
        if final > self.final_chunks:
            toks = stream_chunk_tokens(cache.cum_tokens, self.s, lay.streams,
                                       self.final_chunks)[: final - self.final_chunks]
            w = windows_per_block(toks, lay.block_chunks, lay.seq_len, lay.drop_last)
            self.cum = np.concatenate([self.cum, self.cum[-1] + np.cumsum(w)])
            self.final_chunks = final

    @property
    def per_epoch(self) -> int:
        """Windows in one epoch of this stream (known once the build finished)."""
        return int(self.cum[-1])

    def locate(self, k: int, pad_to: int | None) -> tuple[int, int, int] | str | None:
        """Example ``k`` → ``(epoch, block, offset)``, ``"pad"``, ``"end"``, or ``None``
        when it lies in a block that is not final yet (wait for the producer)."""
        n, epochs = self.per_epoch, self.lay.epochs
        if self.finished:
            if epochs is not None and k >= epochs * n:
                return "pad" if pad_to is not None and k < pad_to else "end"
            if n == 0:
                raise ConfigError(f"stream {self.s} holds no window of seq_len + 1 = "
                                  f"{self.lay.seq_len + 1} tokens ({self.chunks} chunks), so "
                                  "it cannot cycle; use fewer streams, a smaller seq_len, or "
                                  "epochs=1 (single pass, padded)")
            epoch, r = divmod(k, n)
        elif k < n:
            epoch, r = 0, k
        else:
            return None
        b = int(np.searchsorted(self.cum, r, side="right")) - 1
        return epoch, b, r - int(self.cum[b])

    def block_size(self, b: int) -> int:
        return min(self.lay.block_chunks, self.chunks - b * self.lay.block_chunks)


def longest_stream_windows(cum_tokens: IntArray, lay: Layout) -> int:
    """The longest stream's windows per epoch (a finite run pads every stream to it)."""
    return max((int(windows_per_block(stream_chunk_tokens(cum_tokens, s, lay.streams),
                                      lay.block_chunks, lay.seq_len, lay.drop_last).sum())
                for s in range(lay.streams)), default=0)


__all__ = ["Layout", "StreamLayout", "longest_stream_windows"]
