"""``from shardwise.torch import loader``: the PyTorch integration (needs the torch extra)."""

from shardwise.integrations.torch import ShardwiseLoader, loader
from shardwise.integrations.torch_batches import collate, expand

__all__ = ["ShardwiseLoader", "collate", "expand", "loader"]
