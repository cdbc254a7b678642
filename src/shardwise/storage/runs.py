"""Runs of stored tokens, and gathering them: the unit between an order and a cache's bytes.

A **run** is a stretch of one chunk's tokens: ``(chunk, offset, length)``, ``offset``
counted in tokens from the chunk's start. An order of examples becomes runs
(``locate(indices)``); a batch's tokens are its runs gathered, in order, into one flat
array (:func:`gather_runs`) — the one call a reader makes per batch::

    runs   chunk  3  3  7          out  ┌ 3[100:164] ┬ 3[900:964] ┬ 7[0:40] ┐
           offset 100 900 0   ──▶       └──── 64 ────┴──── 64 ────┴── 40 ───┘
           length 64  64  40

Runs are plain numpy columns (:class:`Runs`, or any three arrays in that order), so the
read pipeline builds them with whole-array operations and never names a chunk file.

Why its own module: runs are data and :func:`gather_runs` a pure function of a
``tokens_of(chunk)`` lookup; where the tokens come from (a local map, a download, a piece
of a chunk still arriving) is the :class:`~shardwise.storage.store.ChunkStore`'s business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError

# FEW_RUNS runs or runs of LONG_RUN tokens on average: memoryview slices joined; more, shorter:
# a fancy index per chunk (joined/indexed: 64x2 tok 33/37us, 512x2 152/79, 2048x16 648/986)
FEW_RUNS = 64
LONG_RUN = 16


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
    its memory map). A few runs, or long ones, are sliced and joined in one copy; many
    short ones are gathered with one fancy index per distinct chunk, so the Python cost
    does not grow with the number of runs."""
    n, total = len(runs.chunk), runs.total
    if n <= FEW_RUNS or total >= LONG_RUN * n:
        return _join_runs(tokens_of, runs, dtype)
    out = np.empty(total, dtype=dtype)
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


def _join_runs(tokens_of: Callable[[int], npt.NDArray[Any]], runs: Runs,
               dtype: np.dtype) -> npt.NDArray[Any]:
    """A few runs: each chunk's tokens looked up once (as a memoryview: slicing one costs
    a third of slicing an array), the slices joined in one copy (writable: a bytearray)."""
    chunk, offset, length = runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist()
    # each chunk once, in first-use order; a chunk asked for nothing is not opened
    used = dict.fromkeys(c for c, k in zip(chunk, length, strict=True) if k)
    mem = {c: np.ascontiguousarray(tokens_of(c), dtype=dtype).data for c in used}
    parts = [mem[c][a:a + k] for c, a, k in zip(chunk, offset, length, strict=True) if k]
    return np.frombuffer(bytearray().join(parts), dtype=dtype)


__all__ = ["FEW_RUNS", "LONG_RUN", "Runs", "gather_runs"]
