"""A blend's examples by source: where they are and how their rows come back together.

:func:`locate_sources` answers a blend's ``locate(indices)`` in the form every order does
(:mod:`shardwise.read.orders`): per example its source and its position in that source's
order (the blend's schedule), and per source the runs of stored tokens behind its
examples — the source's own ``locate``, so a blend of TokenDatasets in any order, a new
one included, is located, prefetched and traced through their orders. :func:`assemble`
scatters each source's micro-batch back to the blend's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError
from shardwise.read.ahead import reads_remotely
from shardwise.read.examples import DEFAULT_OUTPUT, Output
from shardwise.read.orders import Runs
from shardwise.read.rows import ROW_FREE
from shardwise.read.tokens.dataset import TokenDataset

Batch = dict[str, npt.NDArray[Any]]
IntArray = npt.NDArray[np.int64]


class BlendRuns(NamedTuple):
    """Blend examples located: ``source`` and ``offset`` (its position in that source's
    order) per example; ``runs[j]``: source ``j``'s runs of stored tokens for its examples
    among them, in example order (``None``: a source that locates none, or took none)."""

    source: IntArray
    offset: IntArray
    runs: list[Runs | None]


def locate_sources(sources: Sequence[Any], src: IntArray, off: IntArray,
                   offsets: Callable[[int, IntArray], IntArray]) -> BlendRuns:
    """:class:`BlendRuns` of examples placed at ``(src, off)``; ``offsets(j, off)``: the
    indices source ``j`` is asked for (its own order's positions)."""
    runs: list[Runs | None] = [None] * len(sources)
    for j in np.unique(src).tolist():
        if isinstance(sources[j], TokenDataset):
            runs[j] = sources[j].locate(offsets(j, off[src == j]))
    return BlendRuns(src, off, runs)


def prefetch_sources(sources: Sequence[Any], where: BlendRuns) -> bool:
    """Prefetch each remote source's chunks of ``where``; whether any cache wants the
    coming examples sooner (``Cache.prefetch``)."""
    more = False
    for ds, runs in zip(sources, where.runs, strict=True):
        if runs is not None and reads_remotely(ds):
            more = bool(ds.cache.prefetch(runs.chunks())) or more
    return more


def assemble(parts: list[tuple[npt.NDArray[np.intp], Batch]], n: int,
              names: list[str]) -> Batch:
    """Scatter each source's rows to their places; rebuild ``cu_seqlens`` over all rows."""
    keys = [k for k in parts[0][1] if k not in ROW_FREE]
    out: Batch = {}
    for key in keys:
        first = np.asarray(parts[0][1][key])
        out[key] = np.empty((n, *first.shape[1:]), dtype=first.dtype)
        for where, batch in parts:
            value = batch.get(key)
            if value is None or value.shape[1:] != first.shape[1:]:
                raise ConfigError(f"blend sources {names} return different examples: "
                                  f"{key!r} is {None if value is None else value.shape[1:]} "
                                  f"in one and {first.shape[1:]} in another (same seq_len "
                                  "and options needed)")
            out[key][where] = value
    if "cu_seqlens" in parts[0][1]:
        out["cu_seqlens"], out["max_seqlen"] = cu_seqlens(parts, n,
                                                           out["input_ids"].shape[1])
    return out


def cu_seqlens(parts: list[tuple[npt.NDArray[np.intp], Batch]], n: int, L: int
                ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Per-row document boundaries from each source's flat ``cu_seqlens``, re-flattened."""
    inner: list[npt.NDArray[np.int64]] = [np.zeros(0, np.int64)] * n
    for where, batch in parts:
        cu = np.asarray(batch["cu_seqlens"], dtype=np.int64)
        for k, r in enumerate(where.tolist()):
            inner[r] = cu[(cu > k * L) & (cu < (k + 1) * L)] - k * L
    flat = np.concatenate([[0]] + [np.append(r * L + b, (r + 1) * L)
                                   for r, b in enumerate(inner)]).astype(np.int32)
    return flat, np.asarray(int(np.diff(flat).max()) if n else 0, np.int32)


__all__ = ["BlendRuns", "assemble", "cu_seqlens", "locate_sources", "prefetch_sources"]


def source_output(sources: list[Any], output: Output) -> tuple[Output, np.dtype[Any]]:
    """A blend's output form, and the token dtype its ``stored`` means (its sources' cache
    dtype when they agree, else int32). The sources must keep the default form: the blend
    joins their rows by key and shapes the joined batch once."""
    shaped = [i for i, d in enumerate(sources)
              if not getattr(d, "output", DEFAULT_OUTPUT).is_default]
    if shaped:
        raise ConfigError(f"blend sources {shaped} were made with output=...: make them with "
                          "the default form and pass output= to the Blend, which shapes "
                          "the mixed batch")
    dtypes = {np.dtype(d.cache.dtype) for d in sources if hasattr(d, "cache")}
    return output, (dtypes.pop() if len(dtypes) == 1 else np.dtype(np.int32))
