"""A micro-batch that is both torch's list of examples and shardwise's stacked arrays.

torch hands whatever ``dataset.__getitems__(indices)`` returns to ``collate_fn``, and every
stock collator (torch's ``default_collate``, Hugging Face's ``default_data_collator``,
torchdata's) expects a *list of per-example dicts*. shardwise assembles a micro-batch as
one dict of stacked ``[B, ...]`` arrays (one allocation per key: the fast path). A
:class:`Rows` is that list — each item a dict of row *views* into the stacked arrays, no
copies — and it carries the stacked dict as ``.batch``, which shardwise's own ``collate``
uses directly::

    batch = {"input_ids": [[1 2 3], [4 5 6]], "cu_seqlens": [0 2 3 6], ...}
    rows  = Rows(batch)        rows[1] == {"input_ids": [4 5 6], "cu_seqlens": [0 1 3], ...}
    rows.batch is batch        default_collate(rows) stacks the rows back (a copy)

Keys that are not one row per example (``cu_seqlens``, a flat list of document starts over
all rows, and ``max_seqlen``) become each row's own boundaries: ``[0, …, seq_len]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Batch = dict[str, npt.NDArray[Any]]
ROW_FREE = ("cu_seqlens", "max_seqlen")  # batch keys that are not one row per example


class Rows(list):  # type: ignore[type-arg]
    """Per-example dicts (views) of a stacked micro-batch; ``.batch`` is the stacked dict.

    A string key reads the stacked dict, so code written for the batched dict keeps
    working: ``rows["input_ids"]`` is the ``[B, seq_len]`` array, ``rows.keys()`` its keys.
    """

    __slots__ = ("batch",)

    def __init__(self, batch: Batch) -> None:
        keys = [k for k in batch if k not in ROW_FREE]
        n = len(batch[keys[0]]) if keys else 0
        rows: list[dict[str, Any]] = [dict(zip(keys, vals, strict=True))
                                      for vals in zip(*(batch[k] for k in keys), strict=True)]
        if "cu_seqlens" in batch and n:
            for row, cu in zip(rows, _row_bounds(batch["cu_seqlens"], n,
                                                 batch[keys[0]].shape[1]), strict=True):
                row["cu_seqlens"] = cu
                row["max_seqlen"] = np.asarray(int(np.diff(cu).max()), np.int32)
        super().__init__(rows)
        self.batch = batch

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.batch[key]
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        return key in self.batch if isinstance(key, str) else super().__contains__(key)

    def keys(self) -> Any:
        return self.batch.keys()

    def items(self) -> Any:
        return self.batch.items()

    def values(self) -> Any:
        return self.batch.values()

    def get(self, key: str, default: Any = None) -> Any:
        return self.batch.get(key, default)


def _row_bounds(cu: npt.NDArray[Any], n: int, L: int) -> list[npt.NDArray[np.int32]]:
    """Split a flat ``cu_seqlens`` over ``n`` rows of ``L`` into each row's ``[0, …, L]``."""
    flat = np.asarray(cu, dtype=np.int64)
    out = []
    for r in range(n):
        inner = flat[(flat > r * L) & (flat < (r + 1) * L)] - r * L
        out.append(np.concatenate([[0], inner, [L]]).astype(np.int32))
    return out


def stack_rows(rows: list[dict[str, Any]]) -> Batch:
    """The inverse of :class:`Rows`: per-example dicts (e.g. PackedSFT's rows, each with its
    own ``cu_seqlens``) → one stacked dict, boundaries flattened over the rows::

        rows cu_seqlens [0, 3, 4], [0, 4]  (L = 4)  ->  [0, 3, 4, 8], max_seqlen 4
    """
    keys = [k for k in rows[0] if k not in ROW_FREE]
    out: Batch = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in keys}
    if "cu_seqlens" in rows[0]:
        L = out[keys[0]].shape[1]
        parts = [np.asarray(r["cu_seqlens"], dtype=np.int64)[1:] + i * L
                 for i, r in enumerate(rows)]
        flat = np.concatenate([np.zeros(1, np.int64), *parts]).astype(np.int32)
        out["cu_seqlens"] = flat
        out["max_seqlen"] = np.asarray(int(np.diff(flat).max()) if len(flat) > 1 else 0,
                                       np.int32)
    return out


def stacked(data: Any) -> Batch | None:
    """The stacked dict of a :class:`Rows`, a plain batched dict, or a list of per-example
    dicts with ``cu_seqlens`` (which stock collators cannot stack); None otherwise."""
    if isinstance(data, Rows):
        return data.batch
    if isinstance(data, dict):
        return data
    if isinstance(data, list) and data and isinstance(data[0], dict) and (
            "cu_seqlens" in data[0]):
        return stack_rows(data)
    return None


__all__ = ["ROW_FREE", "Rows", "stack_rows", "stacked"]
