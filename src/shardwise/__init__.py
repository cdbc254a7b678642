"""shardwise: tokenized, chunked, checksummed caches and exactly resumable per-rank loading.

The names a newcomer needs; everything else lives in the subpackages. Nothing happens at
import: no pools, no environment reads, no torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

from shardwise.build.api import build
from shardwise.errors import (
    CacheError,
    CacheMismatchError,
    ConfigError,
    CorruptChunkError,
    InputError,
    ShardwiseError,
    StateError,
)
from shardwise.format.cache import Cache, open_cache
from shardwise.read.token_dataset import PAD, Shuffle, TokenDataset
from shardwise.read.world import World
from shardwise.state import LoaderState

__all__ = [
    "Cache",
    "CacheError",
    "CacheMismatchError",
    "ConfigError",
    "CorruptChunkError",
    "InputError",
    "LoaderState",
    "PAD",
    "ShardwiseError",
    "Shuffle",
    "StateError",
    "TokenDataset",
    "World",
    "__version__",
    "build",
    "open_cache",
]
