"""shardwise: tokenized, chunked, checksummed caches and exactly resumable per-rank loading.

The names a newcomer needs; everything else lives in the subpackages. Nothing happens at
import: no pools, no environment reads, no torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

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

__all__ = [
    "Cache",
    "CacheError",
    "CacheMismatchError",
    "ConfigError",
    "CorruptChunkError",
    "InputError",
    "ShardwiseError",
    "StateError",
    "__version__",
    "open_cache",
]
