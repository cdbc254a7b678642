"""Packing: cutting the concatenated token stream into training windows.

Why: pretraining consumes fixed-length examples, not documents. All documents are
concatenated in order into one stream of ``T`` tokens and window ``w`` is the ``L + 1``
tokens ``[w*L, w*L + L + 1)`` (``L = seq_len``): inputs are its first ``L`` tokens,
labels its last ``L``. Consecutive windows share one token, so every token is a label
exactly once and no token is thrown away at a window edge (Megatron's GPTDataset layout).

Worked example (``L = 4``, ``T = 11``)::

    tokens   0 1 2 3 4 5 6 7 8 9 10
    w=0      [0 1 2 3 4]
    w=1              [4 5 6 7 8]
    w=2                      [8 9 10 . .]   padded; only kept when drop_last=False

``num_windows(11, 4, drop_last=True) == 2``; ``drop_last=False`` gives 3 and the caller pads
the last window and masks the padding. Windows need not respect documents; document starts
inside a window give ``position_ids`` that restart at 0 and ``cu_seqlens`` for
variable-length attention (Megatron's ``reset_position_ids``)::

    window tokens  a a b b b c      boundaries = [2, 5]  (documents b and c start there)
    position_ids   0 1 0 1 2 0      cu_seqlens = [0, 2, 5, 6]
"""

from __future__ import annotations

from typing import overload

import numpy as np
import numpy.typing as npt

from shardwise.plan._checks import (
    IndexLike,
    IntArray,
    as_index_array,
    check_in_range,
    check_int,
)


def num_windows(total_tokens: int, seq_len: int, *, drop_last: bool) -> int:
    """How many windows a stream of ``total_tokens`` tokens yields (see the module docs).

    ``drop_last=True``: only full windows, ``(T - 1) // L``; otherwise ``ceil((T - 1) / L)``
    with the last one padded. A stream of 0 or 1 tokens has no label, hence no window.
    """
    t = check_int(total_tokens, "total_tokens", minimum=0)
    seq = check_int(seq_len, "seq_len", minimum=1)
    if t <= 1:
        return 0
    return (t - 1) // seq if drop_last else (t - 1 + seq - 1) // seq


def dropped_tokens(total_tokens: int, seq_len: int, *, drop_last: bool) -> int:
    """Tokens no window holds: the tail after the last full window (``drop_last=True``;
    none otherwise, the last window being padded). In the module example (``T = 11``,
    ``L = 4``) windows 0 and 1 hold tokens 0‥8, so tokens 9 and 10 are dropped: 2. A
    stream too short for one window drops all of it."""
    t = check_int(total_tokens, "total_tokens", minimum=0)
    n = num_windows(t, seq_len, drop_last=drop_last)
    if not drop_last:
        return 0 if n else t
    return t - (n * seq_len + 1) if n else t


@overload
def window_span(w: int, seq_len: int, total_tokens: int) -> tuple[int, int]: ...
@overload
def window_span(w: npt.ArrayLike, seq_len: int,
                total_tokens: int) -> tuple[IntArray, IntArray]: ...


def window_span(w: IndexLike, seq_len: int,
                total_tokens: int) -> tuple[int, int] | tuple[IntArray, IntArray]:
    """Token range ``[start, stop)`` of window(s) ``w``; ``stop`` is clipped to the stream.

    A clipped window has ``stop - start < seq_len + 1``: the caller pads and masks it.
    """
    seq = check_int(seq_len, "seq_len", minimum=1)
    t = check_int(total_tokens, "total_tokens", minimum=0)
    arr, scalar = as_index_array(w, "window index")
    check_in_range(arr, num_windows(t, seq, drop_last=False), "window_span", "windows")
    start = arr * seq
    stop = np.minimum(start + seq + 1, t)
    return (int(start.reshape(-1)[0]), int(stop.reshape(-1)[0])) if scalar else (start, stop)


def locate(token_offsets: npt.ArrayLike,
           cum_tokens: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    """Which chunk holds each global token offset, and where inside it.

    ``cum_tokens`` are the exclusive prefix sums of the chunks' token counts with the
    total appended (``n_chunks + 1`` values, non-decreasing; not re-checked here because
    that would cost O(n_chunks) per call). Empty chunks are skipped.
    Example: ``cum_tokens = [0, 5, 5, 9]`` (chunks of 5, 0, 4 tokens), offsets ``[0, 4, 5, 8]``
    -> chunks ``[0, 0, 2, 2]``, offsets in chunk ``[0, 4, 0, 3]``.
    """
    cum = np.asarray(cum_tokens, dtype=np.int64)
    if cum.ndim != 1 or cum.size == 0 or cum[0] != 0:
        raise ValueError(f"locate: cum_tokens must be 1-d and start at 0 (exclusive prefix "
                         f"sums of chunk token counts plus the total), got shape {cum.shape}"
                         f"{'' if cum.size == 0 else f' starting at {cum.reshape(-1)[0]}'}")
    offs, _ = as_index_array(token_offsets, "token offset")
    check_in_range(offs, int(cum[-1]), "locate", "token offsets")
    chunk = np.searchsorted(cum, offs, side="right") - 1
    return chunk.astype(np.int64), offs - cum[chunk]


def document_boundaries(doc_starts_cum: npt.ArrayLike, start: int, stop: int) -> IntArray:
    """Positions, relative to ``start``, where a document begins inside ``[start, stop)``.

    ``doc_starts_cum`` are the documents' start offsets in the stream (exclusive prefix
    sums; a trailing total is allowed). Zero-length documents add no boundary twice.
    Example: starts ``[0, 3, 7, 12]``, window ``[5, 10)`` -> ``[2]``.
    """
    starts = np.asarray(doc_starts_cum, dtype=np.int64)
    lo, hi = np.searchsorted(starts, [start, stop], side="left")
    return np.unique(starts[lo:hi] - start).astype(np.int64)


def _segment_starts(length: int, boundaries: npt.ArrayLike) -> IntArray:
    """``0`` plus the boundaries inside ``(0, length)``, sorted and unique."""
    n = check_int(length, "length", minimum=0)
    b = np.asarray(boundaries, dtype=np.int64)
    b = b[(b > 0) & (b < n)]
    return np.unique(np.concatenate([np.zeros(1 if n else 0, np.int64), b]))


def position_ids(length: int, boundaries: npt.ArrayLike) -> IntArray:
    """Per-token position that restarts at 0 at each document boundary (see module docs)."""
    starts = _segment_starts(length, boundaries)
    pos = np.arange(length, dtype=np.int64)
    seg = np.searchsorted(starts, pos, side="right") - 1
    return pos - starts[seg]


def cu_seqlens(length: int, boundaries: npt.ArrayLike) -> npt.NDArray[np.int32]:
    """Cumulative segment lengths ``[0, ..., length]`` for variable-length attention.

    ``int32`` because that is what flash-attention's ``cu_seqlens`` takes.
    """
    starts = _segment_starts(length, boundaries)
    return np.append(starts, length).astype(np.int32) if length else np.zeros(1, np.int32)

