"""``from shardwise.hf import ShardwiseTrainer``: Hugging Face Trainer / accelerate (needs the
hf extra)."""

from shardwise.integrations.hf import ShardwiseTrainer, ShardwiseTrainerMixin, collate

__all__ = ["ShardwiseTrainer", "ShardwiseTrainerMixin", "collate"]
