"""A cache of many tiny chunks, written fast, for measuring what opening costs at scale.

``shardwise bench open`` needs caches of 10,000 and 100,000 chunks; a real build of one
(multi-TB at the default chunk size) is out of reach, and what opening costs depends on the
number of chunks, not their size. :func:`synth_cache` writes the same files a build would
— Megatron ``.bin/.idx`` (:func:`~shardwise.format.megatron.idx_bytes`), the chunk's
``.json`` (:class:`~shardwise.format.chunk.ChunkMeta`), a ledger and a manifest — without
a tokenizer, and without the build's fsync per file (nothing here must survive a crash).
Tests use it at small sizes, so the layout the bench measures is the layout they check.

Chunk ``c`` (global order) holds ``docs_per_chunk`` documents of lengths that vary with
``c`` (so per-chunk counts are not all equal) and tokens ``(offset + k) % vocab_size``,
``offset`` its first token's position in the stream: any window's ids are known without
reading the cache. Example, ``docs_per_chunk=2``, ``doc_tokens=3``::

    chunk 0: lengths [3, 4]   tokens 0 1 2 3 4 5 6
    chunk 1: lengths [4, 5]   tokens 7 8 …
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import META_SUFFIX, ChunkKind, ChunkMeta, SourceRange, chunk_stem
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress
from shardwise.format.manifest import Manifest, SourceInfo, TokenizerInfo, manifest_checksum
from shardwise.format.megatron import idx_bytes

VOCAB_SIZE = 50_000


@dataclass(frozen=True)
class SynthSpec:
    """The shape of a synthesised cache: ``chunks`` in all, spread round robin over
    ``sources`` sources of segments of at most ``segment_chunks`` chunks each."""

    chunks: int
    sources: int = 8
    segment_chunks: int = 1000
    docs_per_chunk: int = 4
    doc_tokens: int = 16
    vocab_size: int = VOCAB_SIZE

    def lengths(self, c: int) -> np.ndarray:
        """Chunk ``c``'s document lengths (``doc_tokens`` plus a little that varies)."""
        return self.doc_tokens + (c + np.arange(self.docs_per_chunk)) % 5

    def source_chunks(self, s: int) -> int:
        """How many chunks source ``s`` holds (the round robin of the global order)."""
        return self.chunks // self.sources + (s < self.chunks % self.sources)


def token_at(spec: SynthSpec, offsets: np.ndarray) -> np.ndarray:
    """The ids stored at stream ``offsets`` of a synthesised cache."""
    return np.asarray(offsets, dtype=np.int64) % spec.vocab_size


def synth_cache(root: Path, spec: SynthSpec, *, unfinished: bool = False) -> Path:
    """Write ``spec``'s cache into ``root`` (which must not hold one); returns ``root``.

    ``unfinished``: the last source's last segment is still being built (not finished,
    its chunks published so far named): the cache a follow-mode reader sees mid-build."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(spec)
    manifest.save(LocalFiles(root))
    k = spec.sources
    offsets = _chunk_offsets(spec)
    progress = []
    for s in range(k):
        n = spec.source_chunks(s)
        segments = []
        for g, first in enumerate(range(0, max(n, 1), spec.segment_chunks)):
            count = min(spec.segment_chunks, n - first)
            entries = [_write_chunk(root, spec, s, g, i, c=(first + i) * k + s,
                                    offset=int(offsets[(first + i) * k + s]))
                       for i in range(count)]
            segments.append(Segment(start=first, stop=first + count, position=first + count,
                                    line=count, finished=True, chunks=entries))
        progress.append(SourceProgress(segments))
    if unfinished:
        last = progress[-1].segments[-1]
        last.finished, last.stop = False, last.stop + 1
    ledger = Ledger(progress, manifest_xxh3=manifest_checksum(LocalFiles(root)))
    ledger.save(LocalFiles(root))
    return root


def _chunk_offsets(spec: SynthSpec) -> np.ndarray:
    sizes = np.array([int(spec.lengths(c).sum()) for c in range(spec.chunks)], dtype=np.int64)
    return np.concatenate(([0], np.cumsum(sizes)))


def _write_chunk(root: Path, spec: SynthSpec, s: int, g: int, i: int, *, c: int,
                 offset: int) -> ChunkEntry:
    """Chunk ``i`` of segment ``g`` of source ``s`` (global chunk ``c``): its three files,
    written plainly (no temp name, no fsync), and its ledger entry."""
    stem = chunk_stem(s, g, i)
    lengths = spec.lengths(c)
    n = int(lengths.sum())
    tokens = token_at(spec, np.arange(offset, offset + n)).astype(np.uint16)
    payloads = {".bin": tokens.tobytes(), ".idx": idx_bytes(lengths, np.uint16)}
    base = root / stem
    base.parent.mkdir(parents=True, exist_ok=True)
    files = {}
    for suffix, data in payloads.items():
        _write(base.with_name(base.name + suffix), data)
        files[suffix] = {"bytes": len(data), "xxh3_64": bytes_checksum(data)}
    first = i + g * spec.segment_chunks
    meta = ChunkMeta(stem=stem, kind=ChunkKind.TOKENS, source=s,
                     source_path=f"synth-{s}.jsonl", segment=g, index=i,
                     documents=len(lengths), tokens=n,
                     range=SourceRange("row", first, first + 1, i, i + 1), files=files)
    meta_bytes = meta.to_json()
    _write(base.with_name(base.name + META_SUFFIX), meta_bytes)
    return ChunkEntry(stem, len(lengths), n, bytes_checksum(meta_bytes))


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _manifest(spec: SynthSpec) -> Manifest:
    infos = [SourceInfo(path=f"synth-{s}.jsonl", size=spec.source_chunks(s),
                        fingerprint=f"synth{s}", format="jsonl") for s in range(spec.sources)]
    return Manifest(tokenizer=TokenizerInfo("synthesised", spec.vocab_size, None),
                    dtype="uint16", chunk_kind=ChunkKind.TOKENS.value,
                    processor={"kind": "synthesised"},
                    chunking={"max_docs": spec.docs_per_chunk, "max_bytes": None,
                              "segment_bytes": None},
                    sources=infos, created_by="shardwise.bench.synth")
