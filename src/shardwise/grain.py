"""``from shardwise.grain import batch``: Grain batches read in one call (needs grain)."""

from shardwise.integrations.grain import BatchedRead, batch

__all__ = ["BatchedRead", "batch"]
