"""``from shardwise.torchdata import batch_sampler``: torchdata's StatefulDataLoader protocol."""

from shardwise.integrations.torchdata import StatefulBatchSampler, batch_sampler

__all__ = ["StatefulBatchSampler", "batch_sampler"]
