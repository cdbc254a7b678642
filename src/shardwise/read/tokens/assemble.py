"""Examples from the runs of stored tokens behind them: ``Runs`` + tokens → example arrays.

An order says where each example's tokens are (``locate(indices)`` → runs); the store
copies them (``cache.gather(runs)``, the one path to bytes: docs/DESIGN.md, "Orders are
parts"); this module turns the gathered tokens into the arrays a model takes. A whole
window is ``seq_len + 1`` tokens; its first ``seq_len`` are ``input_ids`` and its last
``seq_len`` are ``labels``. Example layout for ``seq_len = 4`` and a window
``[7 8 9 | 3 4]`` where a document starts at the 4th token::

    input_ids     7 8 9 3        labels        8 9 3 4   (next-token: read/examples.py)
    position_ids  0 1 2 0        (reset_position_ids)
    cu_seqlens    [0, 3, 4]      (per row, offset by row * seq_len in a batch)
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.bounded import Bounded
from shardwise.read.examples import ignore_unmasked
from shardwise.storage.cache import Cache

MAX_CACHED_DOC_STARTS = 64


class Assembly:
    """Turns an order's runs into example arrays (the tokens through ``cache.gather``)."""

    def __init__(self, cache: Cache, config: Any) -> None:
        self.cache = cache
        self.cfg = config
        self._starts: Bounded[int, npt.NDArray[np.int64]] = Bounded(MAX_CACHED_DOC_STARTS)
        self._positions = np.arange(config.seq_len, dtype=np.int64)
        self._bounds_wanted = bool(config.reset_position_ids or config.cu_seqlens)

    def _chunk_doc_starts(self, c: int) -> npt.NDArray[np.int64]:
        """Offsets in chunk ``c`` where its documents start (from its ``.idx``)."""
        hit = self._starts.get(c)
        if hit is None:
            lengths = self.cache.doc_lengths(c)
            hit = np.empty(len(lengths), dtype=np.int64)
            hit[0:1] = 0
            np.cumsum(lengths[:-1], dtype=np.int64, out=hit[1:])
            self._starts.put(c, hit)
        return hit

    def from_runs(self, runs: Any) -> dict[str, npt.NDArray[Any]]:
        """Rows for examples given as runs of stored tokens (an order's ``locate``): row
        ``r`` is ``runs.tokens[r]`` tokens gathered (``L + 1``; fewer for a short last
        window, padded; 0: a padding row), the next ones, or, for the runs of one span
        (``runs.step``), those from ``r * step``.

        The hot path of every training step: the tokens are gathered once, in the stored
        dtype (a batch of whole windows lands as ``[B, seq_len + 1]``, a span as
        ``B * seq_len + 1``), and ``input_ids`` / ``labels`` are its two shifted views
        converted to int64 in one call each."""
        bounds = self._run_bounds(runs, runs.step) if self._bounds_wanted else None
        return self._rows(self.cache.gather(runs[:3]), runs.tokens.tolist(), runs.step,
                          bounds)

    def compact_from_runs(self, runs: Any, dtype: np.dtype[Any]
                          ) -> dict[str, npt.NDArray[Any]] | None:
        """``Output(compact=True)``'s batch straight from the gathered tokens, where it is
        only those: every row a whole window and no document masks or positions asked for
        (so ``loss_mask`` is all ones and ``position_ids`` the plain range, both left out).
        None for another shape: the full form is made and shaped (read/examples.py). The
        compact form's point is to cost less than the full one, not more."""
        L, valid = self.cfg.seq_len, runs.tokens.tolist()
        if (self._bounds_wanted or self.cfg.eod_mask_loss
                or valid.count(L + 1) != len(valid)):
            return None
        flat, B = self.cache.gather(runs[:3]), len(valid)
        if runs.step == L:  # one span: rows overlap by one token
            tokens = np.empty((B, L + 1), dtype=dtype)
            tokens[:, :L] = flat[:-1].reshape(B, L)
            tokens[:, L] = flat[L::L]
        else:  # gathered fresh and writable: handed over without a copy when stored
            tokens = flat.reshape(B, L + 1).astype(dtype, copy=False)
        self.cache.raise_if_damaged()  # found by background verification: fail this batch
        return {"tokens": tokens}

    def _rows(self, flat: npt.NDArray[Any], valid: list[int], step: int,
              bounds: list[npt.NDArray[np.int64]] | None) -> dict[str, npt.NDArray[Any]]:
        """The example arrays of ``flat``: each row's ``valid`` tokens, in turn (or from
        ``r * step``)."""
        L, B = self.cfg.seq_len, len(valid)
        whole = valid.count(L + 1) == B
        if whole and step == L:  # one span: rows overlap by one token
            inputs, labels = flat[:-1].reshape(B, L), flat[1:].reshape(B, L)
        else:
            if whole:
                stage = flat.reshape(B, L + 1)
            else:
                stage = np.zeros((B, L + 1), dtype=self.cache.dtype)
                at = 0
                for r, k in enumerate(valid):
                    a = r * step if step else at
                    stage[r, :k] = flat[a: a + k]
                    at += k
            inputs, labels = stage[:, :L], stage[:, 1:]
        return self._finish(inputs.astype(np.int64), labels.astype(np.int64), valid, bounds,
                            whole)

    def _run_bounds(self, runs: Any, step: int) -> list[npt.NDArray[np.int64]]:
        """Each row's document starts strictly inside its ``seq_len`` inputs: the stored
        documents starting inside the runs, as places in the gathered tokens (an empty
        document's start counted once), cut per row."""
        L = self.cfg.seq_len
        found: set[int] = set()
        at = 0
        for c, o, n in zip(*(a.tolist() for a in runs[:3]), strict=True):
            starts = self._chunk_doc_starts(c)
            lo, hi = np.searchsorted(starts, [o, o + n])
            found.update((starts[lo:hi] - o + at).tolist())
            at += n
        places = sorted(found)
        out, at = [], 0
        for r, k in enumerate(runs.tokens.tolist()):
            a = r * step if step else at
            inside = places[bisect_right(places, a): bisect_left(places, a + min(k, L))]
            out.append(np.asarray([x - a for x in inside], dtype=np.int64))
            at += k
        return out

    def _finish(self, input_ids: npt.NDArray[np.int64], labels: npt.NDArray[np.int64],
                valid: list[int], bounds: list[npt.NDArray[np.int64]] | None,
                whole: bool) -> dict[str, npt.NDArray[Any]]:
        """Masks and positions for rows of ``valid`` real tokens each (``L + 1`` for a whole
        window, 0 for padding; ``whole``: every row whole); ``bounds``: each row's document
        starts (None: not wanted)."""
        L = self.cfg.seq_len
        B = len(input_ids)
        if whole:  # no padding: the common case, one fill (np.ones: a Python wrapper)
            loss_mask = np.empty((B, L), dtype=np.float32)
            loss_mask.fill(1.0)
        else:  # a row's label at column j exists when j + 1 < its valid tokens
            loss_mask = (self._positions[None, :] + 1
                         < np.asarray(valid, dtype=np.int64)[:, None]).astype(np.float32)
        if self.cfg.eod_mask_loss:
            loss_mask[input_ids == self.cache.eod_id] = 0.0
        if self.cfg.eod_mask_loss or not whole:
            ignore_unmasked(labels, loss_mask)  # one label convention: read/examples.py
        # filled, never copied from kept arrays: numpy copies a contiguous array with one
        # memcpy, which glibc does by ``rep movsb``, on AMD EPYC ~15x slower between
        # page-aligned buffers (128 KiB: 48 us, a fill 3 us)
        position_ids = np.empty((B, L), dtype=np.int64)
        position_ids[...] = self._positions
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
