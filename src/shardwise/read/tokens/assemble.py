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
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from shardwise.read.examples import ignore_unmasked
from shardwise.read.tokens.plans import (
    doc_lengths_from_starts,
    starts_path,
    stored_doc_starts,
)
from shardwise.storage.cache import MAX_OPEN_CHUNKS, Cache

MAX_CACHED_DOC_STARTS = 64
NO_BOUNDS = np.zeros(0, dtype=np.int64)
NO_BOUNDS.flags.writeable = False


class WindowReader:
    """Turns window indices (or document pieces) into example arrays."""

    def __init__(self, cache: Cache, config: Any) -> None:
        self.cache = cache
        self.cfg = config
        self._starts: OrderedDict[int, npt.NDArray[np.int64]] = OrderedDict()
        self._positions = np.arange(config.seq_len, dtype=np.int64)
        self._positions_2d = self._positions[None, :]
        # strided window views of chunk maps (each keeps its map alive: as many as the
        # cache keeps open)
        self._views: OrderedDict[int, tuple[int, npt.NDArray[Any]]] = OrderedDict()
        self._all_starts: npt.NDArray[np.int64] | None = None
        # the stream as of the dataset's creation (its windows were counted on it); a
        # plain list, because bisecting it per row is ~10x cheaper than numpy calls
        self._cum: list[int] = cache.cum_tokens.tolist()
        self._total = cache.num_tokens

    def __getstate__(self) -> dict[str, Any]:
        """Without the caches of mapped or memory-mapped arrays (they would pickle as
        copies of the data); a copy in another process rebuilds what it reads."""
        d = dict(self.__dict__)
        d["_starts"], d["_views"], d["_all_starts"] = OrderedDict(), OrderedDict(), None
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
            self._starts[c] = hit
            if len(self._starts) > MAX_CACHED_DOC_STARTS:
                self._starts.popitem(last=False)
        else:
            self._starts.move_to_end(c)
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
        if hit is not None:
            self._views.move_to_end(c)
        else:
            L, lo, hi = self.cfg.seq_len, self._cum[c], self._cum[c + 1]
            first = -(-lo // L)
            count = max(0, (hi - L - 1) // L - first + 1)
            src = self.cache.tokens(c)[first * L - lo:]
            view = as_strided(src, shape=(count, L + 1), strides=(L * src.itemsize,
                                                                   src.itemsize),
                              writeable=False)
            hit = self._views[c] = (first, view)
            if len(self._views) > MAX_OPEN_CHUNKS:
                self._views.popitem(last=False)
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

    def from_pieces(self, pieces: list[list[tuple[int, int, int]]],
                    pad: npt.NDArray[np.bool_], doc_starts: npt.NDArray[np.int64]
                    ) -> dict[str, npt.NDArray[Any]]:
        """Rows for document-shuffled windows given as (stored doc, offset, length) runs."""
        L = self.cfg.seq_len
        rows = np.zeros((len(pad), L + 1), dtype=np.int64)
        valid = [0] * len(pad)
        bounds = [NO_BOUNDS] * len(pad)
        real_rows = np.flatnonzero(~pad).tolist()
        for r, runs in zip(real_rows, pieces, strict=True):
            at, b = 0, []
            for doc, off, n in runs:
                s = int(doc_starts[doc]) + off
                rows[r, at: at + n] = self.cache.read_tokens(s, s + n)
                if at > 0 and off == 0:
                    b.append(at)
                at += n
            valid[r] = at
            bounds[r] = np.asarray([x for x in b if x < L], dtype=np.int64)
        self.cache.checks.batch_ids(rows, lambda k: _piece_offset(
            pieces, real_rows, doc_starts, *divmod(k, L + 1)))
        return self._finish(np.ascontiguousarray(rows[:, :L]),
                            np.ascontiguousarray(rows[:, 1:]), valid,
                            bounds if self._want_boundaries else None)

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


def _piece_offset(pieces: list[list[tuple[int, int, int]]], real_rows: list[int],
                  doc_starts: npt.NDArray[np.int64], row: int, col: int) -> int:
    """The stream offset of column ``col`` of document-shuffled row ``row`` (to name the
    chunk an id came from)."""
    at = 0
    for doc, off, n in pieces[real_rows.index(row)]:
        if col < at + n:
            return int(doc_starts[doc]) + off + col - at
        at += n
    raise ValueError(f"column {col} of row {row} holds no token")
