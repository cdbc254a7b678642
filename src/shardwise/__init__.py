"""shardwise: tokenized, chunked, checksummed caches and exactly resumable per-rank loading.

The names a newcomer needs; everything else lives in the subpackages. Nothing happens at
import: no pools, no environment reads, no torch. Readers beyond the core are imported on
first use (``sw.RecordStream`` loads its module when you touch it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# eager: the function ``build`` must shadow the subpackage ``shardwise.build`` for good
from shardwise.build.api import build
from shardwise.errors import (
    CacheError,
    CacheMismatchError,
    ConfigError,
    CorruptChunkError,
    InputError,
    ProducerTimeoutError,
    ShardwiseError,
    StateError,
)
from shardwise.format.cache import Cache, open_cache
from shardwise.read.token_dataset import PAD, Shuffle, TokenDataset
from shardwise.read.world import World
from shardwise.state import LoaderState

# name -> module, imported on first attribute access (keeps `import shardwise` light)
_LAZY = {
    "Blend": "shardwise.read.blend",
    "ChatProcessor": "shardwise.build.chat",
    "ContiguousShards": "shardwise.read.contiguous",
    "PackedSFT": "shardwise.read.sft_pack",
    "ProducerDirDataset": "shardwise.read.producer_dir",
    "RecordStream": "shardwise.read.records",
    "SequentialConsumer": "shardwise.read.consumer",
    "StreamDataset": "shardwise.read.stream",
}

if TYPE_CHECKING:
    from shardwise.build.chat import ChatProcessor
    from shardwise.read.blend import Blend
    from shardwise.read.consumer import SequentialConsumer
    from shardwise.read.contiguous import ContiguousShards
    from shardwise.read.producer_dir import ProducerDirDataset
    from shardwise.read.records import RecordStream
    from shardwise.read.sft_pack import PackedSFT
    from shardwise.read.stream import StreamDataset


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Blend",
    "Cache",
    "CacheError",
    "CacheMismatchError",
    "ChatProcessor",
    "ConfigError",
    "ContiguousShards",
    "CorruptChunkError",
    "InputError",
    "LoaderState",
    "PAD",
    "PackedSFT",
    "ProducerDirDataset",
    "ProducerTimeoutError",
    "RecordStream",
    "SequentialConsumer",
    "ShardwiseError",
    "Shuffle",
    "StateError",
    "StreamDataset",
    "TokenDataset",
    "World",
    "__version__",
    "build",
    "open_cache",
]
