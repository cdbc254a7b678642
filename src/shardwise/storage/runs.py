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
from numpy.lib.stride_tricks import as_strided

from shardwise.errors import ConfigError

# FEW_RUNS runs or runs of LONG_RUN tokens on average: memoryview slices joined; more, shorter:
# a fancy index per chunk (joined/indexed: 64x2 tok 33/37us, 512x2 152/79, 2048x16 648/986)
FEW_RUNS = 64
LONG_RUN = 16
# up to SMALL runs (a micro-batch of windows) are checked and dispatched in Python: a few
# list operations cost less than the fixed cost of the whole-array calls they replace
SMALL = 32
_INT64 = np.dtype(np.int64)  # numpy's one int64 dtype: ``is`` costs less than ``==``


def _column(a: Any) -> npt.NDArray[np.int64]:
    if type(a) is np.ndarray and a.dtype == np.int64 and a.ndim == 1:
        return a
    return np.asarray(a, dtype=np.int64).reshape(-1)


class Runs(NamedTuple):
    """Runs of stored tokens as three equal-length int64 columns."""

    chunk: npt.NDArray[np.int64]
    offset: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]

    @classmethod
    def of(cls, runs: Any) -> Runs:
        """``runs`` (a :class:`Runs`, or any three array-likes ``chunk, offset, length``)
        as int64 columns of one length."""
        chunk, offset, length = runs
        if not (type(chunk) is type(offset) is type(length) is np.ndarray
                and chunk.dtype is offset.dtype is length.dtype is _INT64
                and chunk.ndim == offset.ndim == length.ndim == 1):  # else: made so
            chunk, offset, length = _column(chunk), _column(offset), _column(length)
        if not len(chunk) == len(offset) == len(length):
            raise ConfigError(f"runs: columns of {len(chunk)}, {len(offset)} and "
                              f"{len(length)} rows; chunk, offset and length must be "
                              "equal-length columns")
        return tuple.__new__(cls, (chunk, offset, length))  # a C call: hot

    @property
    def total(self) -> int:
        return int(self.length.sum())

    def check(self, chunk_tokens: npt.NDArray[np.int64], where: str) -> None:
        """Every run lies inside its chunk (``chunk_tokens``: each chunk's token count)."""
        n = len(self.chunk)
        if not n:
            return
        if (min(self.chunk.min(), self.offset.min(), self.length.min()) >= 0
                and self.chunk.max() < len(chunk_tokens)
                and not (self.offset + self.length > chunk_tokens[self.chunk]).any()):
            return  # the usual case: a few whole-array reductions
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
        def offset_of(k: int) -> int:  # only when an id is bad: nothing computed before
            ends = np.cumsum(self.length)
            r = int(np.searchsorted(ends, k, side="right"))
            return int(cum_tokens[self.chunk[r]] + self.offset[r] + k - (ends[r]
                                                                         - self.length[r]))
        return offset_of


class Mapped:
    """A chunk's tokens (its map) and the views :func:`gather_runs` reads them by, kept
    with the map in the store's one entry for the chunk, so a view never outlives its
    map's place in the budget (:class:`~shardwise.storage.store.ChunkStore`): ``mem``, the
    tokens as a memoryview (slicing one costs a third of slicing an array, and
    ``bytearray().join`` copies many slices in one call; made with the entry, a plain
    attribute: a batch looks it up per chunk), and ``rows(n)`` made on first use."""

    __slots__ = ("_rows", "mem", "tokens")

    def __init__(self, tokens: npt.NDArray[Any]) -> None:
        self.tokens = tokens
        self.mem: memoryview = np.ascontiguousarray(tokens).data  # a map: no copy
        self._rows: dict[int, npt.NDArray[Any]] = {}

    def rows(self, n: int) -> npt.NDArray[Any]:
        """``[len - n + 1, n]``: row ``o`` is tokens ``[o, o + n)`` (a strided view, rows
        overlapping), so equal runs of one chunk are one fancy index: ``rows(n)[offsets]``."""
        hit = self._rows.get(n)
        if hit is None:
            t = self.tokens
            hit = self._rows[n] = as_strided(t, shape=(max(len(t) - n + 1, 0), n),
                                             strides=(t.itemsize, t.itemsize),
                                             writeable=False)
        return hit


def gather_runs(mapped: Callable[[int], Mapped], runs: Runs, dtype: np.dtype,
                held: npt.NDArray[np.int64] | None = None,
                where: Callable[[], str] = str) -> npt.NDArray[Any]:
    """The tokens of ``runs`` concatenated (``mapped(c)``: chunk ``c``'s :class:`Mapped`),
    each run first checked inside its chunk when ``held`` (each chunk's token count) is
    given (:meth:`Runs.check`, ``where()`` naming the cache), and copied by the shape of the
    runs, so that the Python cost does not grow with their number:

    * up to ``FEW_RUNS`` (a micro-batch) are checked and dispatched on lists: runs of one
      length in one chunk (a block's windows) as one fancy index of its ``rows(length)``
      view, others (a span's pieces, one run of consecutive windows) as memoryview slices
      joined in one copy;
    * more, of one length: per chunk, one fancy index of its ``rows(length)`` view;
    * more, long ones: memoryview slices joined in one copy;
    * many short ones (a document order's pieces): one fancy index per distinct chunk.
    """
    n = len(runs.chunk)
    if not n:
        return np.zeros(0, dtype=dtype)
    if n <= FEW_RUNS:  # a micro-batch: checked and dispatched on lists
        return _few_runs(mapped, runs, dtype, held, where)
    if held is not None:
        runs.check(held, where())
    k = int(runs.length[0])
    if k and (runs.length == k).all():
        return _equal_runs(mapped, runs, k, dtype)
    total = runs.total
    if total >= LONG_RUN * n:
        return _join_runs(mapped, runs.chunk.tolist(), runs.offset.tolist(),
                          runs.length.tolist(), dtype)
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
        out[starts[sel][rep] + within] = mapped(c).tokens[runs.offset[sel][rep] + within]
    return out


def _few_runs(mapped: Callable[[int], Mapped], runs: Runs, dtype: np.dtype,
              held: npt.NDArray[np.int64] | None, where: Callable[[], str]
              ) -> npt.NDArray[Any]:
    """:func:`gather_runs` of up to ``FEW_RUNS`` runs, checked and dispatched on lists
    (a numpy call, or a numpy scalar per run, costs more than the list operations).

    Checked by ``min``/``max`` of the lists, and each run's end by what was copied: a
    slice ``[a, a + k)`` (``a, k >= 0``) of a chunk's map, which holds exactly the
    ledger's tokens (checked when mapped), is ``k`` tokens exactly when the run lies
    inside the chunk; and row ``a`` of its ``rows(k)`` view exists exactly then (numpy
    raises IndexError past the last)."""
    chunk, offset, length = runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist()
    n, c, k = len(chunk), chunk[0], length[0]
    if n == 1:  # one run (ds[i], a span of consecutive windows)
        return _one_run(mapped, runs, c, offset[0], k, dtype, held, where)
    one = chunk.count(c) == n  # one chunk: a sampler's batch of a one-file cache, a span
    if one and k > 0 and length[1] == k and length.count(k) == n:  # (n > 1 here)
        # a block's windows (one chunk, one length): one fancy index of its rows view
        if held is not None and not (0 <= c < len(held) and min(offset) >= 0):
            runs.check(held, where())  # raises, naming the run
        entry = mapped(c)
        view = entry._rows.get(k)  # Mapped.rows(k) without its call: a batch's hot path
        if view is None:
            view = entry.rows(k)
        try:
            return view[runs.offset].reshape(-1)
        except IndexError:  # a run past its chunk's end
            if held is not None:
                runs.check(held, where())
            raise
    if held is not None and not ((0 <= c < len(held) if one else
                                  min(chunk) >= 0 and max(chunk) < len(held))
                                 and min(offset) >= 0 and min(length) >= 0):
        runs.check(held, where())  # raises, naming the run
    total = sum(length)
    if not one:
        out = _join_runs(mapped, chunk, offset, length, dtype)
    elif not total:  # a chunk asked for nothing is not opened
        out = np.zeros(0, dtype=dtype)
    else:  # one chunk's pieces (a document span's): sliced from one memoryview, joined
        mem = mapped(c).mem
        parts = [mem[a:a + m] for a, m in zip(offset, length, strict=True)]
        out = np.frombuffer(bytearray().join(parts), dtype=dtype)
    if held is not None and len(out) != total:  # a run past its chunk's end
        runs.check(held, where())
    return out


def _one_run(mapped: Callable[[int], Mapped], runs: Runs, c: int, a: int, k: int,
             dtype: np.dtype, held: npt.NDArray[np.int64] | None, where: Callable[[], str]
             ) -> npt.NDArray[Any]:
    """Run ``(c, a, k)``, the only one of ``runs``: one slice of its chunk's memoryview,
    copied once, checked as :func:`_few_runs` checks (a chunk asked for nothing is not
    opened)."""
    if held is not None and not (0 <= c < len(held) and a >= 0 and k >= 0):
        runs.check(held, where())  # raises, naming the run
    out = np.frombuffer(bytearray(mapped(c).mem[a:a + k]), dtype=dtype) if k else np.zeros(
        0, dtype=dtype)
    if held is not None and len(out) != k:  # a run past its chunk's end
        runs.check(held, where())
    return out


def _equal_runs(mapped: Callable[[int], Mapped], runs: Runs, k: int, dtype: np.dtype
                ) -> npt.NDArray[Any]:
    """Runs all ``k`` tokens long: row ``r`` of ``[n, k]`` is run ``r``, copied by one fancy
    index of its chunk's ``rows(k)`` view per distinct chunk."""
    chunk, offset = runs.chunk, runs.offset
    if chunk.min() == chunk.max():
        return mapped(int(chunk[0])).rows(k)[offset].reshape(-1)
    out = np.empty((len(chunk), k), dtype=dtype)
    chunks, inverse = np.unique(chunk, return_inverse=True)
    for u, c in enumerate(chunks.tolist()):
        sel = np.flatnonzero(inverse == u)
        out[sel] = mapped(c).rows(k)[offset[sel]]
    return out.reshape(-1)


def _join_runs(mapped: Callable[[int], Mapped], chunk: list[int], offset: list[int],
               length: list[int], dtype: np.dtype) -> npt.NDArray[Any]:
    """Runs (columns as lists) sliced from each chunk's memoryview, looked up once per
    chunk, and joined in one copy (writable: a bytearray). A chunk asked for nothing is
    not opened."""
    mems: dict[int, memoryview] = {}
    parts = []
    for c, a, k in zip(chunk, offset, length, strict=True):
        mem = mems.get(c)
        if mem is None:
            if not k:
                continue
            mem = mems[c] = mapped(c).mem
        parts.append(mem[a:a + k])
    return np.frombuffer(bytearray().join(parts), dtype=dtype)


__all__ = ["FEW_RUNS", "LONG_RUN", "SMALL", "Mapped", "Runs", "gather_runs"]
