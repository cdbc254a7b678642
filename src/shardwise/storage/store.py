"""The one interface to a cache's bytes: runs of stored tokens, and gathering them.

A **run** is a stretch of one chunk's tokens: ``(chunk, offset, length)``, ``offset``
counted in tokens from the chunk's start. An order of examples becomes runs
(``locate(indices)``); a batch's tokens are its runs gathered, in order, into one flat
array (:func:`gather_runs`) — the one call a reader makes per batch::

    runs   chunk  3  3  7          out  ┌ 3[100:164] ┬ 3[900:964] ┬ 7[0:40] ┐
           offset 100 900 0   ──▶       └──── 64 ────┴──── 64 ────┴── 40 ───┘
           length 64  64  40

Runs are plain numpy columns (:class:`Runs`, or any three arrays in that order), so the
read pipeline builds them with whole-array operations and never names a chunk file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError

# at most this many runs are copied one slice each; more are gathered per chunk with one
# fancy index (a slice costs ~0.3 us of Python, an index ~10 ns per token)
FEW_RUNS = 32


class Runs(NamedTuple):
    """Runs of stored tokens as three equal-length int64 columns."""

    chunk: npt.NDArray[np.int64]
    offset: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]

    @classmethod
    def of(cls, runs: Any) -> Runs:
        """``runs`` (a :class:`Runs`, or any three array-likes ``chunk, offset, length``)
        as int64 columns of one length."""
        chunk, offset, length = (np.asarray(a, dtype=np.int64).reshape(-1) for a in runs)
        if not len(chunk) == len(offset) == len(length):
            raise ConfigError(f"runs: columns of {len(chunk)}, {len(offset)} and "
                              f"{len(length)} rows; chunk, offset and length must be "
                              "equal-length columns")
        return cls(chunk, offset, length)

    @property
    def total(self) -> int:
        return int(self.length.sum())

    def check(self, chunk_tokens: npt.NDArray[np.int64], where: str) -> None:
        """Every run lies inside its chunk (``chunk_tokens``: each chunk's token count)."""
        if not len(self.chunk):
            return
        bad = ((self.chunk < 0) | (self.chunk >= len(chunk_tokens)) | (self.offset < 0)
               | (self.length < 0))
        if not bad.any():
            bad = self.offset + self.length > chunk_tokens[self.chunk]
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            c, a, n = int(self.chunk[r]), int(self.offset[r]), int(self.length[r])
            held = int(chunk_tokens[c]) if 0 <= c < len(chunk_tokens) else None
            raise ConfigError(f"{where}: run {r} asks for tokens [{a}, {a + n}) of chunk "
                              f"{c}; the cache has {len(chunk_tokens)} chunks"
                              + (f" and chunk {c} holds {held} tokens" if held is not None
                                 else "") + "; runs must lie inside their chunks")

    def stream_offset(self, cum_tokens: npt.NDArray[np.int64]) -> Callable[[int], int]:
        """``k → `` the stream offset of flat element ``k`` of the gathered tokens (to name
        a bad id's chunk)."""
        ends = np.cumsum(self.length)

        def offset_of(k: int) -> int:
            r = int(np.searchsorted(ends, k, side="right"))
            return int(cum_tokens[self.chunk[r]] + self.offset[r] + k - (ends[r]
                                                                         - self.length[r]))
        return offset_of


def gather_runs(tokens_of: Callable[[int], npt.NDArray[Any]], runs: Runs,
                dtype: np.dtype) -> npt.NDArray[Any]:
    """The tokens of ``runs`` concatenated (``tokens_of(c)``: chunk ``c``'s tokens, e.g.
    its memory map). A few runs are sliced one by one; many are gathered with one fancy
    index per distinct chunk, so the Python cost does not grow with the number of runs."""
    out = np.empty(runs.total, dtype=dtype)
    n = len(runs.chunk)
    if n <= FEW_RUNS:
        pos = 0
        for c, a, k in zip(runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist(),
                           strict=True):
            if k:
                out[pos:pos + k] = tokens_of(c)[a:a + k]
                pos += k
        return out
    starts = np.cumsum(runs.length) - runs.length
    some = runs.length > 0  # a chunk only asked for nothing is not opened
    chunks, inverse = np.unique(runs.chunk[some], return_inverse=True)
    index = np.flatnonzero(some)
    for u, c in enumerate(chunks.tolist()):
        sel = index[inverse == u]
        lengths = runs.length[sel]
        rep = np.repeat(np.arange(len(sel)), lengths)
        within = np.arange(int(lengths.sum())) - (np.cumsum(lengths) - lengths)[rep]
        out[starts[sel][rep] + within] = tokens_of(c)[runs.offset[sel][rep] + within]
    return out


__all__ = ["FEW_RUNS", "Runs", "gather_runs"]
