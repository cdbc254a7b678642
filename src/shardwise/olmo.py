"""``from shardwise.olmo import ShardwiseDataLoader``: OLMo-core's Trainer over shardwise
(needs the olmo extra)."""

from shardwise.integrations.olmo import ShardwiseDataLoader

__all__ = ["ShardwiseDataLoader"]
