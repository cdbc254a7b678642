"""A batch's runs read by ranged GETs while their chunks are still arriving.

Why: a chunk of 64 MB takes ``latency + 64 MB / bandwidth`` to download (0.7 s at 50 ms
and 100 MB/s), and a shuffled batch reads a few KB from each of several chunks. Waiting for
whole chunks makes the first batch cost the slowest of them; asking for just the batch's
bytes costs one round trip (all ranges at once), while the whole chunks keep downloading
for the batches after::

    batch 1   chunks 3, 7, 9 not here:  GET 3.bin bytes a-b, 7.bin c-d, 9.bin e-f  (~1 RTT)
              whole 3.bin, 7.bin, 9.bin downloading ahead (started by prefetch)
    batch k   3.bin here: its runs from the map; 7.bin still arriving: ranged GET

Integrity: the ids are checked against the vocabulary at once (as every batch's are); the
bytes themselves against the chunk's checked copy when it lands (:meth:`Arriving.verify`:
the download is checked against the chunk's xxh3 as it streams), so bytes a store got
wrong are a :class:`~shardwise.errors.CorruptChunkError` naming the URL, raised by the
reader's next batch after the chunk lands. At most :data:`MAX_PENDING` bytes wait for that
check; past it the reader waits for whole chunks, as without ranged reads.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import CorruptChunkError
from shardwise.remote.client import RemoteStore
from shardwise.storage.chunk_table import View

MAX_PENDING = 64 << 20


class Arriving:
    """The ranged reads of one process and the bytes they returned that still wait for
    their chunk's checked copy (``pending``: chunk → [(token offset, bytes)])."""

    def __init__(self) -> None:
        self.pending: dict[int, list[tuple[int, bytes]]] = {}
        self.pending_bytes = 0
        self.reads = 0  # ranges read so far
        self.read_bytes = 0
        self.rtt_s: float | None = None  # how long one batch's ranged GETs take

    def room(self) -> bool:
        return self.pending_bytes < MAX_PENDING

    def worth(self, etas: list[float]) -> bool:
        """Whether to read a batch by ranged GETs rather than wait for its chunks, whose
        downloads are expected to end in ``etas`` seconds (infinite: not measured yet):
        yes unless every one of them lands within two of the batch's round trips (then
        waiting costs less, and ranged GETs would only take bandwidth from the
        downloads)."""
        if not self.room():
            return False
        rtt = self.rtt_s if self.rtt_s is not None else 0.05
        return any(e > 2 * rtt for e in etas)

    def fetch(self, remote: RemoteStore, view: View, chunk: list[int], offset: list[int],
              length: list[int]) -> list[npt.NDArray[Any]]:
        """The tokens of each run ``(chunk, offset, length)``, all asked for at once."""
        size, dtype = view.dtype.itemsize, view.dtype
        keys = [view.chunks[c].stem + ".bin" for c in chunk]
        started = time.monotonic()
        got = remote.get_ranges([(k, o * size, (o + n) * size)
                                 for k, o, n in zip(keys, offset, length, strict=True)],
                                checked=True)
        took = time.monotonic() - started
        self.rtt_s = took if self.rtt_s is None else 0.7 * self.rtt_s + 0.3 * took
        pieces = []
        for k, c, o, n, g in zip(keys, chunk, offset, length, got, strict=True):
            if isinstance(g, FileNotFoundError):
                raise CorruptChunkError(f"{remote.url_of(k)}: named by the ledger but "
                                        f"missing; run 'shardwise verify {remote.url}'")
            if isinstance(g, Exception):
                raise g
            if len(g) != n * size:
                raise CorruptChunkError(
                    f"{remote.url_of(k)}: a ranged GET of tokens [{o}, {o + n}) returned "
                    f"{len(g)} bytes, expected {n * size}; run 'shardwise verify "
                    f"{remote.url}'")
            self.pending.setdefault(c, []).append((o, g))
            self.pending_bytes += len(g)
            pieces.append(np.frombuffer(g, dtype=dtype))
        self.reads += len(pieces)
        self.read_bytes += sum(len(g) for g in got if isinstance(g, bytes))
        return pieces

    def verify(self, c: int, tokens: npt.NDArray[Any], name: str) -> None:
        """Compare the bytes ranged reads returned for chunk ``c`` with its checked copy
        ``tokens`` (its map)."""
        size = tokens.itemsize
        for o, g in self.pending.pop(c, ()):
            self.pending_bytes -= len(g)
            if tokens[o: o + len(g) // size].tobytes() != g:
                raise CorruptChunkError(
                    f"{name}: a ranged GET of tokens [{o}, {o + len(g) // size}) returned "
                    "other bytes than the chunk's checked copy holds: the store answered "
                    "with wrong bytes, and a batch read them (their ids were in the "
                    "vocabulary); restart from the last checkpoint, and check the store "
                    "or the network between")


__all__ = ["MAX_PENDING", "Arriving"]
