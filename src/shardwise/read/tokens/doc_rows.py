"""Document shuffle's rows: a micro-batch as runs of consecutive windows, each run one
span of the shuffled stream.

A sampler's micro-batch reads consecutive windows, so their tokens are one span of the
shuffled stream: one binary search finds its stored documents
(:meth:`~shardwise.plan.doc_shuffle.DocShuffleIndex.span_pieces`), each piece is copied
once, and the rows are overlapping ``seq_len + 1`` views of the span. For ``seq_len = 4``
and a run of windows 1 and 2 (span ``[4, 13)``)::

    span     a a b b b b c c c        pieces: a from 2 tokens in, b whole, c's first 3
    row 0    a a b b b                document start at column 2
    row 1            b b c c c        document start at column 2
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from shardwise.plan.doc_shuffle import DocShuffleIndex

NO_BOUNDS = np.zeros(0, dtype=np.int64)
NO_BOUNDS.flags.writeable = False
DocRun = tuple[DocShuffleIndex, int, int, int]
"""Consecutive windows of one epoch's document order: (its index, first row of the batch,
first window, how many)."""


class Span:
    """A run's tokens of the shuffled stream, copied out (``flat``, read-only), and where
    each piece came from: stored stream offsets ``[src[j], stops[j])``."""

    __slots__ = ("flat", "src", "stops")

    def __init__(self, flat: npt.NDArray[Any], src: list[int], stops: list[int]) -> None:
        self.flat, self.src, self.stops = flat, src, stops

    def edges(self) -> list[int]:
        """Where each piece starts in ``flat`` (and, last, its length)."""
        return [0, *accumulate(b - a for a, b in zip(self.src, self.stops, strict=True))]

    def stream_offset(self, k: int) -> int:
        """The stored stream offset of ``flat[k]`` (to name the chunk a bad id came from)."""
        rel = self.edges()
        j = bisect_right(rel, k) - 1  # past empty documents: they end where the next starts
        return self.src[j] + k - rel[j]


def span_sources(run: DocRun, seq_len: int, doc_starts: npt.NDArray[np.int64]
                 ) -> tuple[list[int], list[int]]:
    """A run's span of the shuffled stream (its windows, ``seq_len + 1`` tokens each,
    consecutive ones sharing one) as pieces of stored documents: where each starts and
    stops in the stored stream (an empty document: equal ends)."""
    index, _, w, k = run
    L = seq_len
    docs, skip, end = index.span_pieces(w * L, min(w * L + k * L + 1, index.total_tokens))
    src, stops = doc_starts[docs].tolist(), doc_starts[1:][docs].tolist()
    stops[-1] = src[-1] + end
    src[0] += skip
    return src, stops


def stage_runs(runs: list[DocRun], spans: list[Span], rows: int, seq_len: int,
               dtype: npt.DTypeLike) -> tuple[npt.NDArray[Any], list[int]]:
    """``[rows, seq_len + 1]`` of the runs' windows (padding rows: zeros), and each
    row's real tokens (the stream's last window may be short: drop_last=False)."""
    L = seq_len
    stage = np.zeros((rows, L + 1), dtype=dtype)
    valid = [0] * rows
    for (_, row, _, k), span in zip(runs, spans, strict=True):
        flat = span.flat
        full = min(k, (len(flat) - 1) // L)
        if full:
            stage[row: row + full] = as_strided(flat, shape=(full, L + 1), strides=(
                L * flat.itemsize, flat.itemsize), writeable=False)
            valid[row: row + full] = [L + 1] * full
        if full < k:
            tail = flat[full * L:]
            stage[row + full, : len(tail)] = tail
            valid[row + full] = len(tail)
    return stage, valid


def run_bounds(runs: list[DocRun], spans: list[Span], rows: int, seq_len: int
               ) -> list[npt.NDArray[np.int64]]:
    """Each row's document starts strictly inside its ``seq_len`` inputs: the span's
    inner piece edges (an empty document repeats one: counted once)."""
    L = seq_len
    bounds = [NO_BOUNDS] * rows
    for (_, row, _, k), span in zip(runs, spans, strict=True):
        inner, n = span.edges()[1:-1], len(span.flat)
        for j in range(k):
            lo = j * L
            xs = inner[bisect_right(inner, lo): bisect_left(inner, min(lo + L, n))]
            bounds[row + j] = np.asarray(
                [x - lo for i, x in enumerate(xs) if i == 0 or x != xs[i - 1]],
                dtype=np.int64)
    return bounds


def run_offset(runs: list[DocRun], spans: list[Span], L: int, k: int) -> int:
    """The stored stream offset of flat element ``k`` of a ``[rows, L + 1]`` stage."""
    r, col = divmod(k, L + 1)
    for (_, row, _, count), span in zip(runs, spans, strict=True):
        if row <= r < row + count:
            return span.stream_offset((r - row) * L + col)
    raise ValueError(f"row {r} is padding: it holds no token")
