"""``from shardwise.lightning import loader, TrainedPosition``: the Lightning integration
(needs the lightning extra)."""

from shardwise.integrations.lightning import LightningLoader, TrainedPosition, loader

__all__ = ["LightningLoader", "TrainedPosition", "loader"]
