"""External producer directories: read ``chunk_NNNNN.jsonl`` files while another program
writes them, each rank reading only its own chunks.

The producer's side (file names, atomic publication, ``_EXPECTED``, done markers) is
described, with a ten-line Python producer, in :mod:`.producer`.

Rank ``r`` of ``R`` reads chunks ``c % R == r`` in increasing order. ``len(ds)`` is *this
rank's* record count: ``sum(declared(c) for c in range(r, num_chunks, R))`` where
``declared(c)`` is ``records[c]`` or ``records_per_chunk``. It is known before any chunk is
published (``len`` waits for ``_EXPECTED`` up to ``timeout`` if the totals were not
passed), and it is exact when each chunk holds what was declared. Index ``i`` is record
``i mod K`` of this rank's chunk ``i // K`` (``K`` the declared count; cumulative counts
when they differ per chunk). A chunk holding *more* records than declared is an
:class:`InputError`; a chunk holding *fewer* leaves its missing indices raising
``IndexError`` (with the file and counts) — the dataset never repeats, pads or invents a
sample, so declare exact per-chunk counts when the last chunk is short. Ranks own
different numbers of chunks when ``R`` does not divide ``num_chunks``.

It is already this rank's share (``is_sharded = True``): give each rank a plain
DataLoader over it; a ``DistributedSampler`` or accelerate's ``prepare()`` would shard it
again (:func:`~shardwise.read.guard.check_sampler` refuses those). With HF Trainer,
override ``get_train_dataloader`` to return ``DataLoader(ds, batch_size=…)``.

Memory: the chunk in use plus at most the next one (prefetched by a background thread
when already published); a chunk is released, and its done marker written, once every
record of it has been returned. A done marker means "this rank will not read the chunk
again", so a producer that deletes finished chunks gives one pass, and a resume from a
checkpoint taken before the marker needs the chunk back. Read in order (a sequential
sampler): random access across chunks reloads a chunk per jump. DataLoader workers each
hold their own chunks and see only part of each, so done markers need ``num_workers=0``.
``ds.stream()`` is the sequential, resumable view (state ``{"chunk", "record"}``) that
plugs into :class:`~shardwise.read.records.consumer.SequentialConsumer`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardwise.checkpoint import Configured, as_count
from shardwise.concurrency.poll import check_wait_args, wait_until
from shardwise.errors import ConfigError, InputError, ProducerTimeoutError
from shardwise.format.atomic import atomic_write_bytes
from shardwise.read.deprecated import renamed
from shardwise.read.external.one_ahead import OneAhead
from shardwise.read.external.producer_dir.names import DEFAULT_PATTERN, ChunkNames
from shardwise.read.external.producer_dir.producer import (
    DEFAULT_MARKER,
    EXPECTED,
    Chunk,
    Declared,
    EndOfData,
    Pattern,
)
from shardwise.read.external.producer_dir.stream import ProducerDirStream
from shardwise.read.guard import GuardedReader, refuse_sharding_sampler
from shardwise.sources.records import DEFAULT_MAX_RECORD_BYTES, parse_line
from shardwise.world import World

ORDER_VERSION = 1


class ProducerDirDataset(GuardedReader, Configured):
    """This rank's records of a directory a producer fills; map-style (see module doc).

    ``map_fn(record) -> example`` runs once per record when its chunk loads (an error
    in it is an :class:`InputError` naming file and line, reason ``map_error``, as in
    :class:`~shardwise.read.records.stream.RecordStream`; ``encode_fn=`` is its
    deprecated name). ``timeout`` is how long one wait (for a chunk, or for
    ``_EXPECTED``) may last (``math.inf``: wait for ever); polls follow the one rule of
    :func:`~shardwise.concurrency.poll.wait_until` (10 ms doubling up to
    ``poll_interval``). ``pattern`` is a format string (``chunk_{index:05d}.jsonl``) or a
    regex with one capture group (``r"chunk_(\\d+)\\.jsonl"``, see
    :mod:`~shardwise.read.external.producer_dir.names`); ``marker`` is the done marker's
    suffix (``{rank}`` is filled in). A chunk that is gone while this rank's marker of it
    exists was consumed and deleted: asking for it again raises :class:`InputError`
    instead of waiting for a file that will not come back.

    >>> ds = ProducerDirDataset("/shared/sft", map_fn=chat_template,        # doctest: +SKIP
    ...                         world=World.detect(), timeout=1800)
    >>> len(ds), ds[0]["input_ids"][:4]                                    # doctest: +SKIP
    """

    is_sharded = True

    def __init__(self, directory: str | os.PathLike[str], *,
                 map_fn: Callable[[dict[str, Any]], Any] | None = None,
                 world: World | None = None, pattern: Pattern = DEFAULT_PATTERN,
                 num_chunks: int | None = None, records_per_chunk: int | None = None,
                 timeout: float = 600.0, poll_interval: float = 0.5, done_marker: bool = True,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 marker: str = DEFAULT_MARKER,
                 encode_fn: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.names = ChunkNames(pattern)
        map_fn = renamed("encode_fn", encode_fn, "map_fn", map_fn, "ProducerDirDataset")
        if not marker or "/" in marker:
            raise ConfigError(f"marker must be a non-empty file-name suffix such as "
                              f"{DEFAULT_MARKER!r}, got {marker!r}")
        check_wait_args(timeout, poll_interval)
        self._given = Declared.given(num_chunks, records_per_chunk)
        self.directory = Path(directory)
        self.world = World.resolve(world, reader="ProducerDirDataset")
        self.pattern, self.map_fn = self.names.text, map_fn
        self.marker = marker.format(rank=self.world.rank)
        self.timeout, self.poll_interval = float(timeout), float(poll_interval)
        self.done_marker, self.max_record_bytes = done_marker, max_record_bytes
        self._declared = self._given
        self._offsets: np.ndarray | None = None
        self._served: dict[int, tuple[bytearray, list[int]]] = {}  # seen, [count]
        self._next_probe = 0.0
        self._chunks: OneAhead[int, Chunk] = OneAhead(self._load)

    def set_epoch(self, epoch: int) -> None:
        """The hook accelerate, Lightning and HF call each epoch. A producer directory has
        no order of its own to reshuffle (its order is the producer's: every epoch reads
        the same records in the same order), so this checks ``epoch`` and changes
        nothing; shuffle in the sampler, or use a reader with a seeded order."""
        as_count(epoch, "epoch", error=ConfigError)

    # -- identity and totals ----------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "rank": self.world.rank,
                "world_size": self.world.size, "order_version": ORDER_VERSION}

    def chunk_path(self, index: int) -> Path | None:
        """Where chunk ``index`` is (or will be); ``None`` while a regex pattern has not
        seen it."""
        name = self.names.name(self.directory, index, self.marker)
        return None if name is None else self.directory / name

    def marker_path(self, index: int) -> Path | None:
        """This rank's done marker of chunk ``index``."""
        path = self.chunk_path(index)
        return None if path is None else path.with_name(path.name + self.marker)

    def _where(self, index: int) -> Path:
        return self.chunk_path(index) or self.directory / self.names.describe(index)

    def declared(self) -> Declared:
        """The totals from the arguments and ``_EXPECTED`` (re-read until complete)."""
        if not self._declared.sized:
            p = self.directory / EXPECTED
            try:
                body = orjson.loads(p.read_bytes())
            except FileNotFoundError:
                return self._declared
            except orjson.JSONDecodeError as e:
                raise ConfigError(f"{p}: not valid JSON ({e}); write it atomically (temporary "
                                  "name, then rename)") from None
            self._declared = self._given.merge(Declared.parse(body, p), str(p))
        return self._declared

    def _sized(self) -> Declared:
        self._wait(lambda: self.declared().sized, self.directory / EXPECTED,
                   "the producer's totals (num_chunks and records_per_chunk or records: "
                   "pass them to the reader or write _EXPECTED)")
        return self._declared

    def my_chunks(self) -> range:
        """The global indices of this rank's chunks (needs ``num_chunks``)."""
        n = self._sized().num_chunks
        return self.world.round_robin(n or 0)

    def _rank_offsets(self) -> np.ndarray:
        if self._offsets is None:
            d = self._sized()
            counts = [d.count(c) or 0 for c in self.my_chunks()]
            self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return self._offsets

    def __len__(self) -> int:
        refuse_sharding_sampler(self, "ProducerDirDataset")  # a sampler must not split it
        return int(self._rank_offsets()[-1])

    def __repr__(self) -> str:
        w = self.world
        return (f"ProducerDirDataset({str(self.directory)!r}, pattern={self.pattern!r}, "
                f"rank {w.rank} of {w.size}, declared={self._declared})")

    # -- waiting and loading ----------------------------------------------------------
    def _wait(self, ready: Callable[[], Any], path: Path, what: str) -> Any:
        """Poll ``ready()`` by the one rule (:func:`~shardwise.concurrency.poll.wait_until`)
        until truthy; ProducerTimeoutError after ``timeout`` seconds of this one wait."""
        w = self.world
        return wait_until(ready, timeout=self.timeout, poll_interval=self.poll_interval,
                          what=what, on_timeout=lambda waited: ProducerTimeoutError(
                              f"{path}: waited {waited:.1f}s (timeout={self.timeout:g}s) for "
                              f"{what}; rank {w.rank} of {w.size} reads chunks index % "
                              f"{w.size} == {w.rank}; {self._progress()}. Is the producer "
                              "still running? Raise timeout= if it is just slow"))

    def _progress(self) -> str:
        published = self.names.indices(self.directory, self.marker)
        mine = [c for c in published if self.world.owns(c)]
        if not published:
            return "no chunk is published"
        return (f"{len(published)} chunks are published now (highest {published[-1]}; "
                f"{len(mine)} of this rank's)")

    def _available(self, index: int) -> bool:
        """Published now? Raises EndOfData past the declared end, InputError when this
        rank consumed the chunk and the producer deleted it."""
        path = self.chunk_path(index)
        if path is not None and path.exists():
            return True
        marker = self.marker_path(index)
        if marker is not None and marker.exists():
            raise InputError(f"{path}: rank {self.world.rank} already consumed this chunk "
                             f"(its marker {marker.name} exists) and the producer deleted "
                             "it, so its samples cannot be served again. A resume from a "
                             "checkpoint taken before the marker, or a sampler that wraps "
                             "around, needs the chunk back (or a producer that keeps it)",
                             path=str(path), reason="chunk_deleted")
        n = self.declared().num_chunks
        if n is not None and index >= n:
            raise EndOfData(index)
        return False

    def _load(self, index: int) -> Chunk:
        self._wait(lambda: self._available(index), self._where(index),
                   "this chunk to be published")
        path = self._where(index)
        lines = path.read_bytes().split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        records = [self._encode(raw, str(path), ln) for ln, raw in enumerate(lines, 1)]
        expected = self.declared().count(index)
        if expected is not None and len(records) > expected:
            raise InputError(f"{path}: holds {len(records)} records but the producer "
                             f"declared {expected}; the extra records would never be read. "
                             "Fix _EXPECTED (records per chunk) or the chunk", path=str(path),
                             reason="count_mismatch")
        return Chunk(index, str(path), records)

    def _encode(self, raw: bytes, path: str, line: int) -> Any:
        value = parse_line(raw, path=path, line_for_error=line,
                           max_record_bytes=self.max_record_bytes)
        if isinstance(value, InputError):
            raise value
        if self.map_fn is None:
            return value
        try:
            return self.map_fn(value)
        except Exception as e:
            raise InputError(f"{path}:{line}: map_fn raised {type(e).__name__}: {e}",
                             path=path, line=line, reason="map_error") from e

    def chunk(self, index: int) -> Chunk:
        """Chunk ``index`` (waiting for it), prefetching this rank's next published one."""
        n = self.declared().num_chunks
        if n is not None and index >= n:
            raise EndOfData(index)
        got = self._chunks.get(index)
        nxt = index + self.world.size
        now = time.monotonic()  # probe for the next chunk at most once per poll interval
        if (n is None or nxt < n) and now >= self._next_probe and len(self.loaded_chunks()) < 2:
            self._next_probe = now + self.poll_interval
            path = self.chunk_path(nxt)
            if path is not None and path.exists():
                self._chunks.prefetch(nxt)
        return got

    def finish(self, index: int) -> None:
        """This rank is done with chunk ``index``: release it, write its done marker."""
        self._chunks.evict(index)
        self._served.pop(index, None)
        self._next_probe = 0.0
        marker = self.marker_path(index)
        if self.done_marker and marker is not None:
            atomic_write_bytes(marker, b"")

    @property
    def peak_loaded_chunks(self) -> int:
        """The most chunks held at once (current + prefetched); 2 at most."""
        return self._chunks.peak_held

    @property
    def chunks_loaded(self) -> int:
        """How many chunk loads happened (a chunk reloaded after eviction counts again)."""
        return self._chunks.loads

    def loaded_chunks(self) -> list[int]:
        return self._chunks.held()

    # -- map-style ----------------------------------------------------------------------
    def position(self, index: int) -> tuple[int, int]:
        """This rank's ``index`` → ``(global chunk index, record in the chunk)``. With one
        ``records_per_chunk`` for every chunk this needs no ``num_chunks`` (an endless
        producer): ``(rank + (index // K) · R, index % K)``."""
        d = self.declared()
        if d.num_chunks is None and d.records is None and d.records_per_chunk is not None:
            if index < 0:
                raise IndexError(f"index {index}: a negative index needs the length, and "
                                 "the producer has not declared num_chunks")
            j, r = divmod(index, d.records_per_chunk)
            return self.world.rank + j * self.world.size, r
        offsets = self._rank_offsets()
        n = int(offsets[-1])
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range: rank {self.world.rank} has {n} "
                             "records (len() is this rank's declared count)")
        j = int(np.searchsorted(offsets, i, side="right")) - 1
        return self.world.rank + j * self.world.size, i - int(offsets[j])

    def __getitem__(self, index: int) -> Any:
        c, r = self.position(index)
        try:
            got = self.chunk(c)
        except EndOfData:  # unreachable when the declaration is consistent
            raise IndexError(f"chunk {c} is past the declared end") from None
        if r >= len(got.records):
            raise IndexError(f"index {index} is record {r} of {got.path}, which holds only "
                             f"{len(got.records)} records although {self.declared().count(c)}"
                             " were declared; the dataset does not invent samples. Declare "
                             "exact per-chunk counts (records=[...] in _EXPECTED)")
        record = got.records[r]
        seen, count = self._served.setdefault(c, (bytearray(len(got.records)), [0]))
        if not seen[r]:
            seen[r], count[0] = 1, count[0] + 1
            if count[0] == len(got.records):
                self.finish(c)
        return record

    def stream(self) -> ProducerDirStream:
        """A sequential, resumable view over this rank's chunks (see ProducerDirStream)."""
        return ProducerDirStream(self)

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        self._chunks.close()

    def __enter__(self) -> ProducerDirDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ProducerDirDataset"]
