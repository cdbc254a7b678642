"""shardwise: tokenized, chunked, checksummed caches and exactly resumable per-rank loading.

The names a newcomer needs; everything else lives in the subpackages. Nothing happens at
import: no pools, no environment reads, no torch. Readers beyond the core are imported on
first use (``sw.RecordStream`` loads its module when you touch it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardwise._version import __version__
from shardwise.checkpoint import LoaderState
from shardwise.errors import (
    CacheError,
    CacheMismatchError,
    ConfigError,
    CorruptChunkError,
    InputError,
    ProducerTimeoutError,
    RemoteError,
    ShardwiseError,
    StateError,
)
from shardwise.integrations.guards import register_framework_guards
from shardwise.read.examples import Output
from shardwise.read.loader import Loader, numpy_loader
from shardwise.read.orders import PAD
from shardwise.read.placement import Placement
from shardwise.read.tokens.dataset import Shuffle, TokenDataset
from shardwise.storage.cache import Cache
from shardwise.storage.opening import open_cache
from shardwise.world import World
from shardwise.writer.api import build

# the frameworks' guards (read/guard's registry): every reader refuses a wrapper that would
# lose data, whether or not the program imports an integration (contract 7)
register_framework_guards()

# name -> module, imported on first attribute access (keeps `import shardwise` light)
_LAZY = {
    "Blend": "shardwise.read.compose.blend",
    "ChatProcessor": "shardwise.writer.chat",
    "ContiguousShards": "shardwise.read.external.contiguous",
    "PackedSFT": "shardwise.read.compose.sft_pack",
    "ProducerDirDataset": "shardwise.read.external.producer_dir",
    "RecordStream": "shardwise.read.records.stream",
    "SequentialConsumer": "shardwise.read.records.consumer",
    "StreamDataset": "shardwise.read.stream.dataset",
}

if TYPE_CHECKING:
    from shardwise.read.compose.blend import Blend
    from shardwise.read.compose.sft_pack import PackedSFT
    from shardwise.read.external.contiguous import ContiguousShards
    from shardwise.read.external.producer_dir import ProducerDirDataset
    from shardwise.read.records.consumer import SequentialConsumer
    from shardwise.read.records.stream import RecordStream
    from shardwise.read.stream.dataset import StreamDataset
    from shardwise.writer.chat import ChatProcessor


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
    "Loader",
    "LoaderState",
    "Output",
    "PAD",
    "PackedSFT",
    "Placement",
    "ProducerDirDataset",
    "ProducerTimeoutError",
    "RecordStream",
    "RemoteError",
    "SequentialConsumer",
    "ShardwiseError",
    "Shuffle",
    "StateError",
    "StreamDataset",
    "TokenDataset",
    "World",
    "__version__",
    "build",
    "numpy_loader",
    "open_cache",
]
