"""``from shardwise.litgpt import ShardwiseData``: litgpt's data module protocol (needs the
litgpt extra)."""

from shardwise.integrations.litgpt import ShardwiseData, windows

__all__ = ["ShardwiseData", "windows"]
