"""Where one example of a reader's global order comes from, as token runs of a cache.

Each function answers for one example position in O(1)-ish (a keyed permutation, a
binary search, one block's window order), with the reader's own planning functions —
never a replay of the examples before it:

* TokenDataset (global placement): its order's ``locate(i)`` gives the runs of stored
  tokens (:mod:`shardwise.read.orders`), whatever the order.
* Blend: ``Blend.locate(i)`` → its source, its position there and that source's runs.
* StreamDataset: its order's ``locate(i)`` too (:mod:`shardwise.read.orders.stream`), after
  ``where(i)`` names a padding example, one past the end or one not published yet.
* PackedSFT: row ``p`` is bin ``b`` of packing group ``w`` of epoch ``e``; the rows per
  group are counted once per group from the packing plans (record lengths only:
  :class:`~shardwise.read.compose.sft_rows.SftRows`).

A *run* is ``(cache_key, stored_start, stored_stop)``: tokens of the stored stream of
one cache; pieces and lines follow from :class:`~shardwise.read.trace.lines.Documents`.
"""

from __future__ import annotations

from typing import Any

Run = tuple[int, int, int]  # (offset in the example, stored start, stored stop)


def token_runs(ds: Any, i: int) -> list[Run]:
    """Example ``i`` of a TokenDataset as runs of its cache's stored stream: its order's
    ``locate`` (:mod:`shardwise.read.orders`), whatever the order."""
    return stored_runs(ds.locate([i]), ds.cache.cum_tokens)


def stored_runs(runs: Any, cum: Any) -> list[Run]:
    """One example's :class:`~shardwise.read.orders.Runs` as runs of the stored stream
    (``cum``: its cache's chunk token prefix sums)."""
    out, at = [], 0
    for c, o, n in zip(runs.chunk.tolist(), runs.offset.tolist(), runs.length.tolist(),
                       strict=True):
        s = int(cum[c]) + o
        out.append((at, s, s + n))
        at += n
    return out


def stream_runs(ds: Any, i: int) -> list[Run] | str:
    """Example ``i`` of a StreamDataset's global order as runs (its order's ``locate``,
    :mod:`shardwise.read.orders.stream`), or ``"pad"`` / ``"end"`` / ``"unpublished"``."""
    found = ds.order.where(i)
    return found if isinstance(found, str) else token_runs(ds, i)
