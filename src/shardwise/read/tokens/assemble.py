"""Assembling examples from windows of the stored token stream.

A window is ``seq_len + 1`` tokens; its first ``seq_len`` are ``input_ids`` and its last
``seq_len`` are ``labels``. Rows are copied straight out of memory-mapped chunks (a window
that crosses a chunk edge is stitched), so a rank touches only the bytes of its examples.
Example layout for ``seq_len = 4`` and a window ``[7 8 9 | 3 4]`` where a document starts
at the 4th token::

    input_ids     7 8 9 3        labels        8 9 3 4   (next-token: read/examples.py)
    position_ids  0 1 2 0        (reset_position_ids)
    cu_seqlens    [0, 3, 4]      (per row, offset by row * seq_len in a batch)
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from shardwise.concurrency.bounded import Bounded
from shardwise.read.examples import ignore_unmasked
from shardwise.read.tokens.doc_rows import (
    NO_BOUNDS,
    DocRun,
    Span,
    run_bounds,
    run_offset,
    span_sources,
    stage_runs,
)
from shardwise.read.tokens.plans import (
    doc_lengths_from_starts,
    starts_path,
    stored_doc_starts,
)
from shardwise.storage import open_maps
from shardwise.storage.cache import Cache
from shardwise.storage.store import MAX_OPEN_CHUNKS

MAX_CACHED_DOC_STARTS = 64


class WindowReader:
    """Turns window indices (or document pieces) into example arrays."""

    def __init__(self, cache: Cache, config: Any) -> None:
        self.cache = cache
        self.cfg = config
        self._starts: Bounded[int, npt.NDArray[np.int64]] = Bounded(MAX_CACHED_DOC_STARTS)
        self._positions = np.arange(config.seq_len, dtype=np.int64)
        self._positions_2d = self._positions[None, :]
        # strided window views of chunk maps (each keeps its map alive: counted by the
        # process's map budget, storage/open_maps.py, as the cache's own maps are)
        self._views: Bounded[int, tuple[int, npt.NDArray[Any]]] = open_maps.bounded(
            MAX_OPEN_CHUNKS)
        self._all_starts: npt.NDArray[np.int64] | None = None
        # document shuffle: chunk token memory (the maps, as memoryviews: slicing one
        # costs a third of slicing an array, and bytes.join copies them in one call), and
        # the stored doc starts as a plain array
        self._memory: Bounded[int, memoryview] = open_maps.bounded(MAX_OPEN_CHUNKS)
        self.plain_doc_starts: npt.NDArray[np.int64] | None = None
        # the stream as of the dataset's creation (its windows were counted on it); a
        # plain list, because bisecting it per row is ~10x cheaper than numpy calls
        self._cum: list[int] = cache.cum_tokens.tolist()
        self._cum_np = np.asarray(self._cum, dtype=np.int64)
        self._total = cache.num_tokens

    def __getstate__(self) -> dict[str, Any]:
        """Without mapped or memory-mapped arrays (they would pickle as copies of the
        data; the caches pickle empty); a copy in another process rebuilds what it reads."""
        d = dict(self.__dict__)
        d["_all_starts"], d["plain_doc_starts"] = None, None
        d["_positions_2d"] = self._positions[None, :]
        return d

    @property
    def _want_boundaries(self) -> bool:
        return bool(self.cfg.reset_position_ids or self.cfg.cu_seqlens)

    # -- document starts ---------------------------------------------------------------
    def _chunk_doc_starts(self, c: int) -> npt.NDArray[np.int64]:
        """Global stream offsets where chunk ``c``'s documents start."""
        hit = self._starts.get(c)
        if hit is None:
            lengths = self.cache.doc_lengths(c)
            hit = np.empty(len(lengths), dtype=np.int64)
            hit[0:1] = 0
            np.cumsum(lengths[:-1], dtype=np.int64, out=hit[1:])
            hit += self.cache.cum_tokens[c]
            self._starts.put(c, hit)
        return hit

    def _boundaries(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Document starts strictly inside ``(start, start + seq_len)``, relative to start."""
        parts = [self._chunk_doc_starts(c) for c in self.chunks_of([(start, stop)])]
        starts = parts[0] if len(parts) == 1 else np.concatenate(parts)
        lo, hi = np.searchsorted(starts, [start + 1, start + self.cfg.seq_len])
        inside = starts[lo:hi] - start
        if len(inside) > 1:  # empty documents start where the next one does: one boundary
            inside = inside[np.concatenate(([True], inside[1:] != inside[:-1]))]
        return inside

    def all_doc_lengths(self, plan_root: Path) -> npt.NDArray[np.integer]:
        """Every stored document's length (int32 while they fit), read from the node's
        document-starts file (:mod:`.plans`); only a plan's builder needs it."""
        self.stored_doc_starts(plan_root)
        return doc_lengths_from_starts(starts_path(self.cache, plan_root),
                                       self.cache.num_documents)

    def stored_doc_starts(self, plan_root: Path) -> npt.NDArray[np.int64]:
        """Start of every document in the stored stream (n_docs + 1 entries), memory-mapped
        from the plan directory, where one process per node builds it (document shuffle
        only; :mod:`.plans`)."""
        if self._all_starts is None:
            self._all_starts = stored_doc_starts(self.cache, plan_root)
        return self._all_starts

    def chunks_of(self, ranges: list[tuple[int, int]]) -> list[int]:
        """The chunks holding stream tokens ``[start, stop)`` of each range, in first-use
        order, each once."""
        cum, seen = self._cum, {}
        for start, stop in ranges:
            first, last = bisect_right(cum, start) - 1, bisect_right(cum, stop - 1) - 1
            seen.update(dict.fromkeys(range(first, last + 1)))
        return list(seen)

    # -- assembly ------------------------------------------------------------------------
    def from_windows(self, windows: list[int]) -> dict[str, npt.NDArray[Any]]:
        """Rows for window indices (``-1`` marks a padding row, which has no window).

        This is the hot path of every training step, so it is scalar Python over the rows
        and whole-batch numpy for the rest: each window is copied once, in the stored
        dtype, into one ``[B, seq_len + 1]`` staging array (a plain memcpy of a few KB),
        and ``input_ids`` / ``labels`` are its two shifted views converted to int64 in one
        call each."""
        L, B = self.cfg.seq_len, len(windows)
        if self.cache.store.prefetches and self._arriving(windows):
            from shardwise.read.orders.windows import window_runs

            return self.from_runs(window_runs(np.asarray(windows, dtype=np.int64), L,
                                              self._total, self._cum_np))
        valid = [L + 1] * B
        stage = self._gather_from_one_chunk(windows) if B else None
        if stage is None:
            stage = self._gather_rows(windows, valid)
        self.cache.checks.batch_ids(stage, lambda k: windows[k // (L + 1)] * L + k % (L + 1))
        bounds = None
        if self._want_boundaries:
            bounds = [self._boundaries(w * L, w * L + v) if w >= 0 else NO_BOUNDS
                      for w, v in zip(windows, valid, strict=True)]
        return self._finish(stage[:, :L].astype(np.int64), stage[:, 1:].astype(np.int64),
                            valid, bounds)

    def _arriving(self, windows: list[int]) -> bool:
        """Whether a chunk these windows read is still on its way from an object store:
        the batch is then read as runs (``cache.gather``: ranged GETs of just its bytes,
        :class:`~shardwise.storage.bucket.BucketStore`), not from the chunk's map."""
        L, cum, last = self.cfg.seq_len, self._cum, self._total - 1
        chunks = {bisect_right(cum, min(w * L + k, last)) - 1
                  for w in windows if w >= 0 for k in (0, L)}
        return not self.cache.store.here(chunks)

    def _gather_from_one_chunk(self, windows: list[int]) -> npt.NDArray[Any] | None:
        """All rows in one numpy call when every window lies whole inside one chunk (a
        one-file Megatron dataset; block shuffle), else None."""
        L, cum = self.cfg.seq_len, self._cum
        lo, hi = min(windows), max(windows)
        if lo < 0:
            return None
        c = bisect_right(cum, lo * L) - 1
        if hi * L + L + 1 > cum[c + 1]:
            return None
        first, view = self._window_view(c)
        return view[[w - first for w in windows]]

    def _window_view(self, c: int) -> tuple[int, npt.NDArray[Any]]:
        """Chunk ``c``'s whole windows as a strided ``[k, seq_len + 1]`` view of its map
        (consecutive windows share a token, so rows overlap), and the first one's index."""
        hit = self._views.get(c)
        if hit is None:
            L, lo, hi = self.cfg.seq_len, self._cum[c], self._cum[c + 1]
            first = -(-lo // L)
            count = max(0, (hi - L - 1) // L - first + 1)
            src = self.cache.tokens(c)[first * L - lo:]
            view = as_strided(src, shape=(count, L + 1), strides=(L * src.itemsize,
                                                                   src.itemsize),
                              writeable=False)
            hit = self._views.put(c, (first, view))
            open_maps.kept(self._views, c)
        return hit

    def _gather_rows(self, windows: list[int], valid: list[int]) -> npt.NDArray[Any]:
        """Rows one by one (windows in several chunks, across a chunk edge, short or
        padding); sets ``valid`` of short and padding rows."""
        L, B = self.cfg.seq_len, len(windows)
        cum = self._cum
        stage = np.empty((B, L + 1), dtype=self.cache.dtype)
        lo_c, hi_c, src = 0, 0, stage  # no chunk is current yet: src is set before use
        for r, w in enumerate(windows):
            s = w * L
            if not (lo_c <= s and s + L + 1 <= hi_c):  # not inside the last chunk used
                if w < 0:  # padding
                    stage[r], valid[r] = 0, 0
                    continue
                chunk = bisect_right(cum, s) - 1
                lo_c, hi_c = cum[chunk], cum[chunk + 1]
                src = self.cache.tokens(chunk)
                if s + L + 1 > hi_c:  # across chunk edges, or the short last window
                    e = min(s + L + 1, self._total)
                    stage[r, : e - s] = self.cache.read_tokens(s, e)
                    stage[r, e - s:] = 0
                    valid[r] = e - s
                    continue
            stage[r] = src[s - lo_c: s - lo_c + L + 1]  # the common case
        return stage

    # -- any order: runs of stored tokens -----------------------------------------------
    def from_runs(self, runs: Any) -> dict[str, npt.NDArray[Any]]:
        """Rows for examples given as runs of stored tokens (an order's ``locate``): row
        ``r`` is the next ``runs.tokens[r]`` tokens gathered (``L + 1``; fewer for a short
        last window, padded; 0: a padding row)."""
        bounds = self._run_bounds(runs) if self._want_boundaries else None
        return self._rows(self.cache.gather(runs[:3]), runs.tokens.tolist(), bounds)

    def from_pieces(self, src: list[int], stops: list[int], valid: list[int]
                    ) -> dict[str, npt.NDArray[Any]]:
        """:meth:`from_runs` for runs given as stored stream offsets ``[src[j], stops[j])``
        (a document order's random batch), joined as a span is (:meth:`_copy_span`: one
        copy each, from the chunk maps) rather than through ``Cache.gather``: the same
        tokens, at a third of the fixed cost per batch. No document bounds: a reader that
        wants them reads :meth:`from_runs`."""
        span = self._join(src, stops)
        self.cache.checks.batch_ids(span.flat, span.stream_offset)
        return self._rows(span.flat, valid, None)

    def _rows(self, flat: npt.NDArray[Any], valid: list[int],
              bounds: list[npt.NDArray[np.int64]] | None) -> dict[str, npt.NDArray[Any]]:
        """The example arrays of ``flat``: each row's ``valid`` tokens, in turn."""
        L = self.cfg.seq_len
        if valid and min(valid) == max(valid) == L + 1:
            stage = flat.reshape(len(valid), L + 1)
        else:
            stage = np.zeros((len(valid), L + 1), dtype=self.cache.dtype)
            at = 0
            for r, k in enumerate(valid):
                stage[r, :k] = flat[at: at + k]
                at += k
        return self._finish(stage[:, :L].astype(np.int64), stage[:, 1:].astype(np.int64),
                            valid, bounds)

    def _run_bounds(self, runs: Any) -> list[npt.NDArray[np.int64]]:
        """Each row's document starts strictly inside its ``seq_len`` inputs: the stored
        documents starting inside its runs (an empty document's start counted once)."""
        L, cum = self.cfg.seq_len, self._cum
        chunk, offset, length = (a.tolist() for a in runs[:3])
        out, j = [], 0
        for k in runs.tokens.tolist():
            at, found = 0, []
            while at < k:
                c, o, n = chunk[j], offset[j], length[j]
                starts = self._chunk_doc_starts(c)
                lo, hi = np.searchsorted(starts, [cum[c] + o, cum[c] + o + n])
                found += (starts[lo:hi] - cum[c] - o + at).tolist()
                at, j = at + n, j + 1
            out.append(np.asarray(sorted({x for x in found if 0 < x < L}), dtype=np.int64))
        return out

    # -- document shuffle ----------------------------------------------------------------
    def from_doc_runs(self, runs: list[DocRun], rows: int, doc_starts: npt.NDArray[np.int64]
                      ) -> dict[str, npt.NDArray[Any]]:
        """Rows for document-shuffled windows, given as runs of consecutive windows (a
        sampler's micro-batch is one run); rows in no run are padding.

        A run is one span of the shuffled stream, copied piece by piece (a stretch of one
        stored document: a few per window, ~0.1 us each) into one flat buffer in the
        stored dtype; its windows are overlapping ``seq_len + 1`` rows of that buffer. A
        run of whole windows filling the batch (the common case) turns its buffer
        straight into ``input_ids`` and ``labels``, one conversion each."""
        L = self.cfg.seq_len
        spans = [self._copy_span(run, doc_starts) for run in runs]
        if len(runs) == 1 and runs[0][3] == rows and len(spans[0].flat) == rows * L + 1:
            flat = spans[0].flat
            self.cache.checks.batch_ids(flat, spans[0].stream_offset)
            input_ids = flat[:-1].astype(np.int64).reshape(rows, L)
            labels = flat[1:].astype(np.int64).reshape(rows, L)
            valid = [L + 1] * rows
        else:
            stage, valid = stage_runs(runs, spans, rows, L, self.cache.dtype)
            self.cache.checks.batch_ids(stage, lambda k: run_offset(runs, spans, L, k))
            input_ids, labels = stage[:, :L].astype(np.int64), stage[:, 1:].astype(np.int64)
        bounds = run_bounds(runs, spans, rows, L) if self._want_boundaries else None
        return self._finish(input_ids, labels, valid, bounds)

    def doc_sources(self, run: DocRun, doc_starts: npt.NDArray[np.int64]
                    ) -> tuple[list[int], list[int]]:
        """:func:`~shardwise.read.tokens.doc_rows.span_sources` at this ``seq_len``."""
        return span_sources(run, self.cfg.seq_len, doc_starts)

    def _copy_span(self, run: DocRun, doc_starts: npt.NDArray[np.int64]) -> Span:
        """The run's pieces joined (one copy each, from memoryviews of the chunk maps)."""
        return self._join(*self.doc_sources(run, doc_starts))

    def _join(self, src: list[int], stops: list[int]) -> Span:
        """Stored stream tokens ``[src[j], stops[j])`` joined in one copy, each from a
        memoryview of its chunk's map (a piece of a document lies inside one chunk)."""
        if len(self._cum) == 2:  # one chunk: stored offsets are its offsets
            mem = self._chunk_memory(0)
            parts = [mem[a:b] for a, b in zip(src, stops, strict=True)]
        else:
            cum = self._cum
            chunks = (np.searchsorted(self._cum_np, src, side="right") - 1).tolist()
            parts = [self._chunk_memory(c)[a - cum[c]: b - cum[c]]
                     for c, a, b in zip(chunks, src, stops, strict=True) if b > a]
        flat = np.frombuffer(b"".join(parts), dtype=self.cache.dtype)
        return Span(flat, src, stops)

    def _chunk_memory(self, c: int) -> memoryview:
        """Chunk ``c``'s tokens as a memoryview of its map (kept, and counted by the
        process's map budget)."""
        hit = self._memory.get(c)
        if hit is None:
            hit = self._memory.put(c, self.cache.tokens(c).data)
            open_maps.kept(self._memory, c)
        return hit

    def _finish(self, input_ids: npt.NDArray[np.int64], labels: npt.NDArray[np.int64],
                valid: list[int], bounds: list[npt.NDArray[np.int64]] | None
                ) -> dict[str, npt.NDArray[Any]]:
        """Masks and positions for rows of ``valid`` real tokens each (``L + 1`` for a whole
        window, 0 for padding); ``bounds``: each row's document starts (None: not wanted)."""
        L = self.cfg.seq_len
        B = len(input_ids)
        if valid.count(L + 1) == B:  # no padding: the common case, one fill
            loss_mask = np.ones((B, L), dtype=np.float32)
        else:  # a row's label at column j exists when j + 1 < its valid tokens
            loss_mask = (self._positions[None, :] + 1
                         < np.asarray(valid, dtype=np.int64)[:, None]).astype(np.float32)
        if self.cfg.eod_mask_loss:
            loss_mask[input_ids == self.cache.eod_id] = 0.0
        if self.cfg.eod_mask_loss or valid.count(L + 1) != B:
            ignore_unmasked(labels, loss_mask)  # one label convention: read/examples.py
        position_ids = self._position_rows(B).copy()
        out: dict[str, npt.NDArray[Any]] = {"input_ids": input_ids, "labels": labels,
                                              "loss_mask": loss_mask,
                                              "position_ids": position_ids}
        self.cache.raise_if_damaged()  # found by background verification: fail this batch
        if bounds is None:
            return out
        if self.cfg.reset_position_ids:
            for r, b in enumerate(bounds):
                for x in b.tolist():
                    position_ids[r, x:] -= position_ids[r, x]
        if self.cfg.cu_seqlens:
            cu = [0]
            for r, b in enumerate(bounds):
                cu.extend((r * L + b).tolist())
                cu.append((r + 1) * L)
            cu_arr = np.asarray(cu, dtype=np.int32)
            out["cu_seqlens"] = cu_arr
            out["max_seqlen"] = np.asarray(int(np.diff(cu_arr).max()) if B else 0, np.int32)
        return out

    def _position_rows(self, rows: int) -> npt.NDArray[np.int64]:
        """``[rows, seq_len]`` of ``0 … seq_len - 1``, kept to be copied (a memcpy is
        cheaper than a broadcasting fill)."""
        if len(self._positions_2d) != rows:
            self._positions_2d = np.tile(self._positions, (rows, 1))
        return self._positions_2d

