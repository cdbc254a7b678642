"""``from shardwise.torchtitan import ShardwiseDataLoader``: torchtitan's dataloader config
protocol (needs the torchtitan extra)."""

from shardwise.integrations.torchtitan import STATE_KEY, ShardwiseDataLoader

__all__ = ["STATE_KEY", "ShardwiseDataLoader"]
