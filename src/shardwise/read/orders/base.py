"""What an order is: global example indices → the runs of stored tokens behind them.

An order of a :class:`~shardwise.read.tokens.dataset.TokenDataset` is one class with a
name (the reader's ``shuffle=`` value, recorded in its state) and one question answered,
vectorised: ``locate(indices)`` → :class:`Runs` (chunk, offset, length of stored tokens,
in example order). Reading (``cache.gather(runs)``), prefetch and ``trace`` ask only that:
an order has no read path of its own.

Adding an order is one class and one :func:`register_order` call::

    class Reversed(WindowOrder):
        name = "reversed"
        def window_block(self, epoch, positions):
            return self.n - 1 - positions
    register_order(Reversed)

    TokenDataset(cache, seq_len=2048, shuffle="reversed")
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError

PAD = -1
IntArray = npt.NDArray[np.int64]


class Runs(NamedTuple):
    """Runs of stored tokens as three equal-length int64 columns, each run non-empty (the form
    ``Cache.gather`` takes: docs/DESIGN.md, ``ChunkStore``), and how many tokens each
    example holds (``L + 1``; fewer for a short last window; 0 for padding).

    ``step``: 0, each example's tokens follow the one before's in the gathered tokens (its
    own runs); ``L``, the examples are consecutive windows of one span of the order's
    stream, example ``r`` the ``tokens[r]`` gathered from ``r * L`` (neighbours share a
    token): the runs are the span's, each stored token read once. An order answers a
    sampler's micro-batch (a list of consecutive indices) so; an array, per example."""

    chunk: IntArray
    offset: IntArray
    length: IntArray
    tokens: IntArray
    step: int = 0

    def starts(self) -> IntArray:
        """Where each example's runs start (and, last, how many runs there are): example
        ``r`` is runs ``[starts[r], starts[r + 1])``. Runs of one span (``step``) have no
        such split: ValueError."""
        if self.step:
            raise ValueError("runs of one span (step > 0) are not split per example; "
                             "locate an array of indices for per-example runs")
        ends = np.cumsum(self.length)
        first = ends.searchsorted(np.cumsum(self.tokens) - self.tokens, side="right")
        return np.append(first, len(self.length))

    def chunks(self) -> list[int]:
        """The chunks the runs read, in first-use order, each once (what to prefetch)."""
        return list(dict.fromkeys(self.chunk[self.length > 0].tolist()))


class Order:
    """An order of a dataset's examples (see the module docs); built per dataset.

    ``ds`` gives what an order may depend on: ``ds.config`` (seq_len, seed, the order's
    options), ``ds.num_windows``, ``ds.cache`` (its chunks' token counts)."""

    name: ClassVar[str]

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process keeps no derived arrays (a memory-mapped plan would
        pickle as a copy): it rebuilds what it uses."""
        return {**self.__dict__, **self.fresh()}

    def fresh(self) -> dict[str, Any]:
        """The derived attributes as a new order starts them (what is not pickled)."""
        return {}

    def locate(self, indices: npt.ArrayLike) -> Runs:
        """The runs of stored tokens behind examples ``indices`` (:data:`PAD`: none)."""
        raise NotImplementedError


def check_indices(indices: npt.ArrayLike) -> IntArray:
    """``indices`` as int64, each ``>= 0`` or :data:`PAD`."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and idx.min() < PAD:
        bad = int(idx[idx < PAD][0])
        raise IndexError(f"example indices must be >= 0 (or {PAD} for padding), got {bad}")
    return idx


def register_order(cls: type[Order], orders: dict[str, type[Order]] | None = None
                   ) -> type[Order]:
    """Make ``cls`` a ``shuffle=`` value of TokenDataset (and of a read config) under
    ``cls.name``; registering the same class again is a no-op, another class under a
    taken name is refused."""
    known = ORDERS if orders is None else orders
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{cls.__name__}: an order needs a class attribute 'name' (the "
                          "shuffle= value that selects it)")
    if known.get(name, cls) is not cls:
        raise ConfigError(f"order {name!r} is already {known[name].__qualname__}; give "
                          f"{cls.__qualname__} another name")
    known[name] = cls
    return cls


def order_class(name: str) -> type[Order]:
    """The order registered under ``name``; ConfigError naming the known ones."""
    hit = ORDERS.get(str(name))
    if hit is None:
        raise ConfigError(f"shuffle must be one of {sorted(ORDERS)}, got {name!r} (a new "
                          "order is registered with shardwise.read.orders.register_order)")
    return hit


ORDERS: dict[str, type[Order]] = {}
"""The registry of orders by name: the built-in ones, then any registered (the one piece
of module state here: it is what makes an order addable without editing the reader)."""

__all__ = ["ORDERS", "PAD", "Order", "Runs", "check_indices", "order_class",
           "register_order"]
