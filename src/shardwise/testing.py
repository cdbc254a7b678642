"""Contract checks, public so users can run them on their own readers.

Both helpers take *factories*, so they can build fresh readers as often as they need:

>>> assert_same_global_order(lambda w: loader(ds, global_batch_size=8,    # doctest: +SKIP
...                          micro_batch_size=2, world=w), world_sizes=[1, 2, 4], steps=16)
>>> assert_resumes_exactly(lambda: loader(ds, global_batch_size=8,        # doctest: +SKIP
...                        micro_batch_size=2, world=World(0, 1)), steps=20)

A batch is a dict of arrays (numpy or torch); rows are compared bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

import numpy as np

from shardwise.world import World

Batch = dict[str, Any]


def _np(batch: Batch, key: str) -> np.ndarray:
    value = batch[key]
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def take(reader: Iterable[Batch], n: int) -> list[Batch]:
    """The first ``n`` batches of ``reader``; fails if it ends early."""
    out = list(islice(iter(reader), n))
    if len(out) != n:
        raise AssertionError(f"the reader ended after {len(out)} batches, expected {n}")
    return out


def global_rows(make_reader: Callable[[World], Iterable[Batch]], world_size: int, steps: int,
                key: str = "input_ids") -> np.ndarray:
    """Simulate ``world_size`` ranks in this process: rows of ``steps`` steps, each step's
    micro-batches concatenated in rank order (the global order the ranks consumed)."""
    per_rank = [take(make_reader(World(r, world_size)), steps) for r in range(world_size)]
    rows = [_np(per_rank[r][k], key) for k in range(steps) for r in range(world_size)]
    return np.concatenate(rows)


def assert_same_global_order(make_reader: Callable[[World], Iterable[Batch]], *,
                             world_sizes: Sequence[int], steps: int, key: str = "input_ids"
                             ) -> None:
    """Every world size yields the same global sequence of rows (the size-1 run's)."""
    sizes = list(world_sizes)
    smallest = min(sizes)
    total = None
    for w in sorted(sizes):
        n_steps = steps * smallest // w
        rows = global_rows(make_reader, w, n_steps, key)
        if total is None:
            total = rows
            continue
        if rows.shape != total.shape or not np.array_equal(rows, total):
            bad = next((i for i in range(min(len(rows), len(total)))
                        if not np.array_equal(rows[i], total[i])), min(len(rows), len(total)))
            raise AssertionError(f"world size {w} diverges from world size {smallest} at "
                                 f"global row {bad}")


def assert_resumes_exactly(make_reader: Callable[[], Any], *, steps: int,
                           stop_points: Sequence[int] | None = None,
                           key: str = "input_ids",
                           make_resumed: Callable[[], Any] | None = None) -> None:
    """Stopping after ``k`` batches, saving ``state_dict()`` and restoring it into a fresh
    reader continues with exactly the batches of an uninterrupted run, for every ``k``
    (default: every step). ``make_resumed`` builds the restored reader (e.g. with other
    DataLoader workers); it defaults to ``make_reader``."""
    import json

    reference = [_np(b, key) for b in take(make_reader(), steps)]
    points = range(steps) if stop_points is None else stop_points
    shape = None
    for k in points:
        first = make_reader()
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        state = json.loads(json.dumps(state))  # a checkpoint is plain JSON
        keys = sorted(state)
        if shape is not None and keys != shape:
            raise AssertionError(f"state keys changed between steps: {shape} vs {keys}")
        shape = keys
        resumed = (make_resumed or make_reader)()
        resumed.load_state_dict(state)
        tail = [_np(b, key) for b in take(resumed, steps - k)]
        for j, (got, want) in enumerate(zip(tail, reference[k:], strict=True)):
            if not np.array_equal(got, want):
                raise AssertionError(f"resumed after {k} batches: batch {k + j} differs")
