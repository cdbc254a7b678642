"""A producer directory: ``chunk_NNNNN.jsonl`` files another program publishes while each
rank reads its own. One import path for both sides (``from
shardwise.read.external.producer_dir import ProducerDirDataset, publish_chunk``); the parts:

* :mod:`.producer` — the producer's contract (names, atomic publication, ``_EXPECTED``,
  done markers) and the Python producer's helpers;
* :mod:`.names` — index ↔ file name, for a format or a regex pattern;
* :mod:`.dataset` — :class:`ProducerDirDataset`, this rank's records, map-style;
* :mod:`.stream` — :class:`ProducerDirStream`, the sequential resumable view (``ds.stream()``).
"""

from shardwise.read.external.producer_dir.dataset import ProducerDirDataset
from shardwise.read.external.producer_dir.producer import (
    DEFAULT_MARKER,
    EXPECTED,
    Chunk,
    Declared,
    EndOfData,
    chunk_indices,
    delete_finished,
    done_marker,
    finished_by_all,
    publish_chunk,
    write_expected,
)
from shardwise.read.external.producer_dir.stream import ProducerDirStream

__all__ = ["DEFAULT_MARKER", "EXPECTED", "Chunk", "Declared", "EndOfData",
           "ProducerDirDataset", "ProducerDirStream", "chunk_indices", "delete_finished",
           "done_marker", "finished_by_all", "publish_chunk", "write_expected"]
