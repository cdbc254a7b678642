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

Grain reads a batch from a source in one call when the source has ``_getitems(indices)``
(its ``SupportsBatchedReadRandomAccessDataSource`` protocol; ``grain.MapDataset.source``
passes it through shuffle, slice, repeat, map and filter): every shardwise map-style reader
sets ``_getitems = __getitems__``, so Grain gets these rows, from
one batched read, instead of one ``__getitem__`` per example.

Keys that are not one row per example (``cu_seqlens``, a flat list of document starts over
all rows, and ``max_seqlen``) become each row's own boundaries: ``[0, …, seq_len]``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.read.guard import Placed, PlacedByLoader

Batch = dict[str, npt.NDArray[Any]]
ROW_FREE = ("cu_seqlens", "max_seqlen")  # batch keys that are not one row per example


class Rows(list):  # type: ignore[type-arg]
    """Per-example dicts (views) of a stacked micro-batch; ``.batch`` is the stacked dict.

    A string key reads the stacked dict, so code written for the batched dict keeps
    working: ``rows["input_ids"]`` is the ``[B, seq_len]`` array, ``rows.keys()`` its keys.

    The rows are plain dicts in a plain list, built eagerly: a list filled on first
    access would look empty to the C code that reads a list's items directly
    (``PySequence_Fast``, ``[] + rows``, ``numpy``), and a non-dict row type makes torch's
    ``default_collate`` collate every key twice. Building them costs the row views and
    one dict display per row (:func:`_row_maker`).
    """

    __slots__ = ("batch",)

    def __init__(self, batch: Batch) -> None:
        keys, make = _row_maker(tuple(batch))
        if keys:
            super().__init__(map(make, *[batch[k] for k in keys]))
        if "cu_seqlens" in batch and keys and len(self):
            bounds, longest = _row_bounds(batch["cu_seqlens"], len(self),
                                          batch[keys[0]].shape[1])
            for row, cu, m in zip(self, bounds, longest, strict=True):
                row["cu_seqlens"] = cu
                row["max_seqlen"] = m
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


@functools.lru_cache(maxsize=64)
def _row_maker(names: tuple[str, ...]) -> tuple[tuple[str, ...], Callable[..., dict[str, Any]]]:
    """The per-row keys of a batch with keys ``names`` and ``lambda v0, v1: {keys[0]: v0,
    keys[1]: v1}``: a dict display builds a row about twice as fast as ``dict(zip(keys,
    values))`` (what Rows spent most of its time on). Made once per key tuple, as
    ``collections.namedtuple`` makes its ``__new__``; the keys are bound as names of the
    namespace, so no key text enters the source."""
    keys = tuple(k for k in names if k not in ROW_FREE)
    params = [f"v{i}" for i in range(len(keys))]
    source = (f"lambda {', '.join(params)}: "
              f"{{{', '.join(f'k{i}: {v}' for i, v in enumerate(params))}}}")
    return keys, eval(source, {f"k{i}": k for i, k in enumerate(keys)})


def _row_bounds(cu: npt.NDArray[Any], n: int, L: int
                ) -> tuple[list[npt.NDArray[np.int32]], list[npt.NDArray[np.int32]]]:
    """Split a flat ``cu_seqlens`` over ``n`` rows of ``L`` into each row's ``[0, …, L]``
    and its longest document (0-d), vectorised: one array, then a view per row::

        cu [0, 3, 4, 8] (L = 4)  ->  [0, 3, 4], [0, 4];  max_seqlen 3, 4
    """
    flat = np.asarray(cu, dtype=np.int64)
    inner = flat[(flat > 0) & (flat < n * L) & (flat % L != 0)]  # strictly inside a row
    row = inner // L
    counts = np.bincount(row, minlength=n) + 2  # each row adds its 0 and L
    ends = np.cumsum(counts)
    starts = ends - counts
    out = np.empty(int(ends[-1]), np.int32)
    out[starts], out[ends - 1] = 0, L
    out[np.arange(len(inner)) + 1 + 2 * row] = inner - row * L
    longest = np.maximum.reduceat(np.diff(out, append=0), starts).astype(np.int32)
    return ([out[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)],
            [longest[i, ...] for i in range(n)])


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


def own_example(ds: Any, i: int) -> Any:
    """Example ``i`` of ``ds``, read by shardwise itself (a Blend's iteration, a layout
    check of its parts) after its own placement check: a guarded reader is asked through
    a :class:`~shardwise.read.guard.Placed` batch (``ds[i]`` would count as an unplaced
    read in a multi-rank job), any other dataset by ``ds[i]``."""
    if not isinstance(ds, PlacedByLoader):
        return ds[i]
    batch = ds.get_batch(Placed([i]))  # type: ignore[attr-defined]
    return {k: (v if k in ROW_FREE else v[0]) for k, v in batch.items()}


__all__ = ["ROW_FREE", "Rows", "own_example", "stack_rows", "stacked"]
