"""What an order is: a pure plan from global example indices to the runs of stored tokens
behind them, over a :class:`~shardwise.read.orders.layout.TokenLayout` — never a reader.

An order is one class with a name (the reader's ``shuffle=`` value, recorded in its
state), its own options (a frozen dataclass, :attr:`Order.Options`: the block order's
``block_size`` is the block order's, and only a state of that order holds it), and one
question answered, vectorised: ``locate(indices)`` → :class:`Runs` (chunk, offset, length
of stored tokens, in example order). Reading (``cache.gather(runs)``), prefetch and
``trace`` ask only that: an order has no read path of its own.

Adding an order, with an option of its own, is one class and one :func:`register_order`
call; any reader takes it (a TokenDataset, a stream placement's blocks, a blend)::

    @dataclass(frozen=True)
    class Stride(OrderOptions):
        stride: int = 2

    class Strided(WindowOrder):
        name, Options = "strided", Stride
        def window_block(self, epoch, positions):
            return positions * self.options.stride % self.n
    register_order(Strided)

    TokenDataset(cache, seq_len=2048, shuffle="strided", stride=3)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt

from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError
from shardwise.read.orders.layout import TokenLayout

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


@dataclass(frozen=True)
class OrderOptions:
    """An order's own options (this base: none). A subclass adds fields with defaults and
    checks them in ``__post_init__``; they are the order's keyword arguments to a reader
    and the keys its state holds."""

    def state(self) -> dict[str, Any]:
        """The options as a state's config holds them (plain JSON, by field name)."""
        return asdict(self)


def option_names(cls: type[OrderOptions]) -> list[str]:
    return [f.name for f in fields(cls)]


class Order:
    """An order of a layout's examples (see the module docs): ``layout`` (what it may
    depend on: chunk token sums, seq_len, drop_last, documents on demand), ``seed`` and
    its own ``options``. Built once per reader; ``locate`` is the hot path."""

    name: ClassVar[str]
    Options: ClassVar[type[OrderOptions]] = OrderOptions

    def __init__(self, layout: TokenLayout, *, seed: int = 0,
                 options: OrderOptions | None = None) -> None:
        opts = self.Options() if options is None else options
        if type(opts) is not self.Options:
            raise ConfigError(f"order {self.name!r} takes {self.Options.__name__} options, "
                              f"got {opts!r}")
        self.layout, self.seed, self.options = layout, seed, opts
        self.n: int = layout.num_windows
        # what the order derives as it is read (cached blocks, permutations, mapped plans):
        # per process, never pickled (a memory-mapped plan would travel as a copy), made
        # again where a copy is used (concurrency.local: the one lifecycle)
        self.derived: ProcessLocal[dict[str, Any]] = ProcessLocal(
            self.fresh, name=f"the {self.name} order's derived state")

    def fresh(self) -> dict[str, Any]:
        """The derived state as a process starts it (:attr:`derived`)."""
        return {}

    def locate(self, indices: npt.ArrayLike) -> Runs:
        """The runs of stored tokens behind examples ``indices`` (:data:`PAD`: none)."""
        raise NotImplementedError


def order_options(name: str, given: Mapping[str, Any], reader: str
                  ) -> tuple[OrderOptions, dict[str, Any]]:
    """Order ``name``'s options from a reader's keyword arguments ``given`` (those named
    by its :attr:`Order.Options` fields), and the other arguments. An option of another
    registered order is a ConfigError naming the order it belongs to."""
    cls = order_class(name).Options
    mine = option_names(cls)
    rest = {k: v for k, v in given.items() if k not in mine}
    for other in sorted(ORDERS):
        theirs = sorted(set(option_names(ORDERS[other].Options)) & set(rest))
        if theirs and other != name:
            raise ConfigError(f"{reader}: {theirs} is an option of shuffle={other!r}, not "
                              f"of shuffle={name!r} (whose options are {mine})")
    try:
        return cls(**{k: v for k, v in given.items() if k in mine}), rest
    except TypeError as e:
        raise ConfigError(f"{reader}: shuffle={name!r}: {e}") from None


def option_defaults(name: str) -> dict[str, Any]:
    """Order ``name``'s options at their defaults, by field name."""
    return {f.name: f.default for f in fields(order_class(name).Options)
            if f.default is not MISSING}


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

__all__ = ["ORDERS", "PAD", "Order", "OrderOptions", "Runs", "check_indices", "option_defaults",
           "option_names", "order_class", "order_options", "register_order"]
