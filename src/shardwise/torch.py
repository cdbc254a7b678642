"""``from shardwise.torch import loader``: the PyTorch integration (needs the torch extra)."""

from shardwise.integrations.torch import ShardwiseLoader, collate, loader

__all__ = ["ShardwiseLoader", "collate", "loader"]
