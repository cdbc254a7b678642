"""Orders of a TokenDataset's examples as parts: each answers ``locate(indices)`` → the
runs of stored tokens behind those examples (:mod:`.base`); the built-in ones are
registered here, others with :func:`register_order`. Stream placement answers the same
question for a StreamDataset (:mod:`.stream`)."""

from shardwise.read.orders.base import (
    ORDERS,
    PAD,
    Order,
    Runs,
    order_class,
    register_order,
)
from shardwise.read.orders.block import BlockOrder
from shardwise.read.orders.document import DocumentShuffle
from shardwise.read.orders.none import StoredOrder
from shardwise.read.orders.stream import StreamOrder, block_runs
from shardwise.read.orders.window import WindowShuffle
from shardwise.read.orders.windows import WindowOrder, window_runs

for _cls in (StoredOrder, WindowShuffle, BlockOrder, DocumentShuffle):
    register_order(_cls)

__all__ = ["ORDERS", "PAD", "BlockOrder", "DocumentShuffle", "Order", "Runs", "StoredOrder",
           "StreamOrder", "WindowOrder", "WindowShuffle", "block_runs", "order_class",
           "register_order", "window_runs"]
