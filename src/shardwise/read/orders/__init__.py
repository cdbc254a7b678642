"""Orders as plans: each is a frozen options dataclass it owns and a pure plan over a
:class:`~shardwise.read.orders.layout.TokenLayout` answering ``locate(indices)`` → the runs
of stored tokens behind those examples (:mod:`.base`); the built-in ones are registered
here, others with :func:`register_order`. Stream placement answers the same question for
a StreamDataset, ordering each block's windows by any window order (:mod:`.stream`).
Nothing here imports a reader (read/tokens, read/stream): tests/test_layers.py."""

from shardwise.read.orders.base import (
    ORDERS,
    PAD,
    Order,
    OrderOptions,
    Runs,
    option_names,
    order_class,
    order_options,
    register_order,
)
from shardwise.read.orders.block import BlockOptions, BlockOrder
from shardwise.read.orders.document import DocumentShuffle
from shardwise.read.orders.layout import TokenLayout
from shardwise.read.orders.none import StoredOrder
from shardwise.read.orders.stream import StreamOrder, block_runs
from shardwise.read.orders.window import WindowShuffle
from shardwise.read.orders.windows import WindowOrder, window_runs

for _cls in (StoredOrder, WindowShuffle, BlockOrder, DocumentShuffle):
    register_order(_cls)

__all__ = ["ORDERS", "PAD", "BlockOptions", "BlockOrder", "DocumentShuffle", "Order",
           "OrderOptions", "Runs", "StoredOrder", "StreamOrder", "TokenLayout", "WindowOrder",
           "WindowShuffle", "block_runs", "option_names", "order_class", "order_options",
           "register_order", "window_runs"]
