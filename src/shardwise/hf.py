"""``from shardwise.hf import ShardwiseTrainer``: Hugging Face Trainer / accelerate (needs the
hf extra)."""

from shardwise.integrations.hf import ShardwiseTrainer, ShardwiseTrainerMixin
from shardwise.integrations.hf_batches import collate

__all__ = ["ShardwiseTrainer", "ShardwiseTrainerMixin", "collate"]
