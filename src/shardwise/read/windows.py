"""Assembling examples from windows of the stored token stream.

A window is ``seq_len + 1`` tokens; its first ``seq_len`` are ``input_ids`` and its last
``seq_len`` are ``labels``. Rows are copied straight out of memory-mapped chunks (a window
that crosses a chunk edge is stitched), so a rank touches only the bytes of its examples.
Example layout for ``seq_len = 4`` and a window ``[7 8 9 | 3 4]`` where a document starts
at the 4th token::

    input_ids     7 8 9 3        labels        8 9 3 4
    position_ids  0 1 2 0        (reset_position_ids)
    cu_seqlens    [0, 3, 4]      (per row, offset by row * seq_len in a batch)
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.format.atomic import save_npy
from shardwise.format.cache import Cache
from shardwise.plan.doc_shuffle import plan_fingerprint

MAX_CACHED_DOC_STARTS = 64


class WindowReader:
    """Turns window indices (or document pieces) into example arrays."""

    def __init__(self, cache: Cache, config: Any) -> None:
        self.cache = cache
        self.cfg = config
        self._starts: OrderedDict[int, npt.NDArray[np.int64]] = OrderedDict()
        self._positions = np.arange(config.seq_len, dtype=np.int64)
        self._all_starts: npt.NDArray[np.int64] | None = None

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
        cum = self.cache.cum_tokens
        c0 = int(np.searchsorted(cum, start, side="right")) - 1
        c1 = int(np.searchsorted(cum, stop - 1, side="right")) - 1
        parts = [self._chunk_doc_starts(c) for c in range(c0, c1 + 1)]
        starts = parts[0] if len(parts) == 1 else np.concatenate(parts)
        lo, hi = np.searchsorted(starts, [start + 1, start + self.cfg.seq_len])
        return starts[lo:hi] - start

    def all_doc_lengths(self, plan_root: Path) -> npt.NDArray[np.int64]:
        starts = self.stored_doc_starts(plan_root)
        return np.diff(starts)

    def stored_doc_starts(self, plan_root: Path) -> npt.NDArray[np.int64]:
        """Start of every document in the stored stream (n_docs + 1 entries), built once
        from the chunks' ``.idx`` files and cached as ``.npy`` (document shuffle only)."""
        if self._all_starts is None:
            key = plan_fingerprint({"doc_starts": self.cache.fingerprint,
                                    "tokens": self.cache.num_tokens,
                                    "chunks": len(self.cache.chunks)})
            path = plan_root / f"{key}.doc_starts.npy"
            if path.exists():
                self._all_starts = np.load(path, mmap_mode="r", allow_pickle=False)
            else:
                lengths = [np.asarray(self.cache.doc_lengths(c), dtype=np.int64)
                           for c in range(len(self.cache.chunks))]
                starts = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
                np.cumsum(np.concatenate(lengths), out=starts[1:])
                save_npy(path, starts)
                self._all_starts = starts
        return self._all_starts

    # -- assembly ------------------------------------------------------------------------
    def from_windows(self, windows: npt.NDArray[np.int64], pad: npt.NDArray[np.bool_]
                     ) -> dict[str, npt.NDArray[Any]]:
        """Rows for window indices (``pad`` marks padding rows, which have no window).

        Tokens go straight from the chunk into ``input_ids`` and ``labels`` (no
        intermediate row array and no strided copies: this is the hot path)."""
        L, B = self.cfg.seq_len, len(pad)
        total = self.cache.num_tokens
        input_ids = np.empty((B, L), dtype=np.int64)
        labels = np.empty((B, L), dtype=np.int64)
        valid = np.zeros(B, dtype=np.int64)
        bounds: list[npt.NDArray[np.int64]] = []
        starts = windows * L
        stops = np.minimum(starts + L + 1, total)
        cum = self.cache.cum_tokens
        chunks = np.searchsorted(cum, starts, side="right") - 1
        offsets = starts - cum[chunks]
        inside = stops <= cum[chunks + 1]
        real_rows = np.flatnonzero(~pad)
        valid[real_rows] = stops - starts
        if len(real_rows) < B:
            input_ids[pad] = 0
            labels[pad] = 0
        tokens = self.cache.tokens
        want_bounds = self._want_boundaries
        for r, s, e, c, lo, one in zip(real_rows.tolist(), starts.tolist(), stops.tolist(),
                                       chunks.tolist(), offsets.tolist(), inside.tolist(),
                                       strict=True):
            # the common case: the window lies in one chunk
            src = tokens(c)[lo: lo + e - s] if one else self.cache.read_tokens(s, e)
            if e - s == L + 1:
                input_ids[r] = src[:L]
                labels[r] = src[1:]
            else:  # the short last window (drop_last=False): zero-filled
                row = np.zeros(L + 1, dtype=np.int64)
                row[: e - s] = src
                input_ids[r], labels[r] = row[:L], row[1:]
            if want_bounds:
                bounds.append(self._boundaries(s, e))
        return self._finish(input_ids, labels, valid, real_rows, bounds)

    def from_pieces(self, pieces: list[list[tuple[int, int, int]]],
                    pad: npt.NDArray[np.bool_], doc_starts: npt.NDArray[np.int64]
                    ) -> dict[str, npt.NDArray[Any]]:
        """Rows for document-shuffled windows given as (stored doc, offset, length) runs."""
        L = self.cfg.seq_len
        rows = np.zeros((len(pad), L + 1), dtype=np.int64)
        valid = np.zeros(len(pad), dtype=np.int64)
        bounds = []
        real_rows = np.flatnonzero(~pad)
        for r, runs in zip(real_rows.tolist(), pieces, strict=True):
            at, b = 0, []
            for doc, off, n in runs:
                s = int(doc_starts[doc]) + off
                rows[r, at: at + n] = self.cache.read_tokens(s, s + n)
                if at > 0 and off == 0:
                    b.append(at)
                at += n
            valid[r] = at
            bounds.append(np.asarray([x for x in b if x < L], dtype=np.int64))
        return self._finish(np.ascontiguousarray(rows[:, :L]),
                            np.ascontiguousarray(rows[:, 1:]), valid, real_rows,
                            bounds if self._want_boundaries else [])

    def _finish(self, input_ids: npt.NDArray[np.int64], labels: npt.NDArray[np.int64],
                valid: npt.NDArray[np.int64], real_rows: npt.NDArray[np.intp],
                bounds: list[npt.NDArray[np.int64]]) -> dict[str, npt.NDArray[Any]]:
        L = self.cfg.seq_len
        B = len(input_ids)
        if (valid == L + 1).all():  # no padding: the common case, one fill
            loss_mask = np.ones((B, L), dtype=np.float32)
        else:
            loss_mask = (np.arange(L)[None, :] + 1 < valid[:, None]).astype(np.float32)
        if self.cfg.eod_mask_loss:
            loss_mask[input_ids == self.cache.eod_id] = 0.0
        position_ids = np.empty((B, L), dtype=np.int64)
        position_ids[:] = self._positions
        out: dict[str, npt.NDArray[Any]] = {"input_ids": input_ids, "labels": labels,
                                              "loss_mask": loss_mask,
                                              "position_ids": position_ids}
        if not self._want_boundaries:
            return out
        row_bounds = [np.zeros(0, dtype=np.int64)] * B
        for r, b in zip(real_rows.tolist(), bounds, strict=True):
            row_bounds[r] = b
        if self.cfg.reset_position_ids:
            for r, b in enumerate(row_bounds):
                for x in b.tolist():
                    position_ids[r, x:] -= position_ids[r, x]
        if self.cfg.cu_seqlens:
            cu = [0]
            for r, b in enumerate(row_bounds):
                cu.extend((r * L + b).tolist())
                cu.append((r + 1) * L)
            cu_arr = np.asarray(cu, dtype=np.int32)
            out["cu_seqlens"] = cu_arr
            out["max_seqlen"] = np.asarray(int(np.diff(cu_arr).max()) if B else 0, np.int32)
        return out
