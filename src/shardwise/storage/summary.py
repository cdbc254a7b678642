"""What a cache holds, for ``shardwise inspect``: sources, totals, build status, lengths.

Everything except the length distribution comes from the manifest and the ledger's view
(``ledger.index``; no chunk file is opened), including the count of empty documents (zero
tokens, or only the appended end-of-document), which the ledger keeps per chunk. Document
lengths come from the chunks' ``.idx`` files (or the ``input_ids`` column of Parquet
chunks); for a huge cache they are *sampled*: at most ``MAX_SAMPLE_CHUNKS`` evenly spaced
chunks, every ``k``-th document of each, so that about ``sample_docs`` lengths are read.
The histogram says when it is a sample.

Length buckets are powers of two: bucket ``[2^b, 2^(b+1))``, plus ``[0, 0]`` for empty
documents. Example: lengths ``[1, 3, 3, 900]`` give ``[1, 1]: 1, [2, 3]: 2,
[512, 1023]: 1``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import CorruptChunkError
from shardwise.format.chunk import ChunkKind
from shardwise.format.megatron import read_idx
from shardwise.storage.cache import Cache

MAX_SAMPLE_CHUNKS = 1024
SAMPLE_DOCS = 1_000_000


@dataclass(frozen=True)
class SourceSummary:
    """One source: everything the ledger has published for it (visible or not)."""

    path: str
    format: str
    size: int
    chunks: int
    documents: int
    tokens: int
    finished: bool
    errors: dict[str, int] = field(default_factory=dict)
    empty: int = 0


@dataclass(frozen=True)
class LengthStats:
    """Document lengths (of a sample when ``sampled``); ``buckets`` are ``(lo, hi, count)``
    with ``hi`` inclusive."""

    documents: int
    sampled: bool
    buckets: list[tuple[int, int, int]]
    min: int = 0
    max: int = 0
    mean: float = 0.0
    median: float = 0.0
    p99: float = 0.0


@dataclass(frozen=True)
class CacheSummary:
    """The answer of :func:`summarize`; ``to_dict`` is what ``inspect --json`` prints."""

    path: str
    layout: str
    chunk_kind: str
    dtype: str
    tokenizer: str
    vocab_size: int | None
    eod_id: int | None
    status: str
    visible_chunks: int
    visible_documents: int
    visible_tokens: int
    sources: list[SourceSummary]
    errors: dict[str, int]
    lengths: LengthStats

    @property
    def chunks(self) -> int:
        return sum(s.chunks for s in self.sources)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.sources)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sources)

    @property
    def empty_documents(self) -> int:
        return sum(s.empty for s in self.sources)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["totals"] = {"chunks": self.chunks, "documents": self.documents,
                       "empty_documents": self.empty_documents, "tokens": self.tokens,
                       "skipped": sum(self.errors.values())}
        return d


def summarize(cache: Cache, *, sample_docs: int = SAMPLE_DOCS) -> CacheSummary:
    """Summarise an open cache (shardwise or Megatron); reads at most ~``sample_docs``
    document lengths."""
    lengths, sampled = sample_lengths(cache, sample_docs)
    status = "finished" if cache.finished else "building"
    m = cache.manifest
    return CacheSummary(
        path=cache.location if m is not None else str(cache.chunks[0].base),
        layout="megatron" if m is None else "shardwise",
        chunk_kind=m.chunk_kind if m is not None else ChunkKind.TOKENS.value,
        dtype=cache.dtype.name, tokenizer=m.tokenizer.fingerprint if m else "unknown",
        vocab_size=cache.vocab_size, eod_id=cache.eod_id, status=status,
        visible_chunks=len(cache.chunks), visible_documents=cache.num_documents,
        visible_tokens=cache.num_tokens, sources=_sources(cache),
        errors=dict(cache.errors), lengths=length_stats(lengths, sampled=sampled))


def _sources(cache: Cache) -> list[SourceSummary]:
    if cache.manifest is None:  # a Megatron prefix: one file, count its empty sequences
        c = cache.chunks[0]
        size = c.base.with_name(c.base.name + ".bin").stat().st_size
        return [SourceSummary(str(c.base), "megatron", size, 1, c.documents, c.tokens, True,
                              empty=_zero_lengths(_with(c.base, ".idx")))]
    return [SourceSummary(info.shown, info.format, info.size, t.chunks, t.documents, t.tokens,
                          t.finished, dict(t.errors), t.empty)
            for info, t in zip(cache.manifest.sources, cache.sources, strict=False)]


def sample_lengths(cache: Cache, sample_docs: int = SAMPLE_DOCS
                   ) -> tuple[npt.NDArray[np.int64], bool]:
    """Document lengths of the visible chunks, or of an even sample (see the module doc).

    Returns the lengths and whether they are a sample."""
    n = len(cache.chunks)
    picks = list(range(n))
    if n > MAX_SAMPLE_CHUNKS:
        picks = sorted(set(np.linspace(0, n - 1, MAX_SAMPLE_CHUNKS).round().astype(int)))
    docs = int(cache.chunks.columns.documents[picks].sum())
    stride = max(1, -(-docs // max(sample_docs, 1)))
    parts = [_chunk_lengths(cache, i, stride) for i in picks]
    lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return lengths.astype(np.int64, copy=False), len(picks) < n or stride > 1


def _chunk_lengths(cache: Cache, i: int, stride: int) -> npt.NDArray[np.int64]:
    """Every ``stride``-th document length; only those are copied out of the index map
    (a chunk of a cache on an object store is read through its download directory)."""
    info = cache.chunks[i]
    suffix = ".idx" if info.kind is ChunkKind.TOKENS else ".parquet"
    try:
        if info.kind is ChunkKind.TOKENS:
            return cache.with_chunk_file(i, suffix, lambda p: np.asarray(
                read_idx(p).sequence_lengths[::stride], dtype=np.int64))
        return cache.with_chunk_file(i, suffix, lambda p: _parquet_lengths(p, stride))
    except FileNotFoundError:  # a raw crash of inspect before (issue 27, fuzz long run)
        raise CorruptChunkError(f"{cache.store.name(info.stem + suffix)}: named by the "
                                "ledger but missing; run 'shardwise verify' on the cache"
                                ) from None


def _parquet_lengths(path: Path, stride: int) -> npt.NDArray[np.int64]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if "input_ids" not in pq.ParquetFile(path).schema_arrow.names:
        return np.zeros(0, dtype=np.int64)
    column = pq.read_table(path, columns=["input_ids"]).column("input_ids")
    return np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False),
                      dtype=np.int64)[::stride]


def _zero_lengths(idx: Path, block: int = 1 << 24) -> int:
    """Empty sequences of a Megatron ``.idx``, counted block by block over its map."""
    lengths = read_idx(idx).sequence_lengths
    return sum(int(np.count_nonzero(lengths[i:i + block] == 0))
               for i in range(0, len(lengths), block))


def _with(base: Path, suffix: str) -> Path:
    return base.with_name(base.name + suffix)


def length_stats(lengths: npt.NDArray[np.int64], *, sampled: bool = False) -> LengthStats:
    """Power-of-two histogram and a few quantiles of ``lengths``."""
    if len(lengths) == 0:
        return LengthStats(0, sampled, [])
    return LengthStats(len(lengths), sampled, log2_buckets(lengths), int(lengths.min()),
                       int(lengths.max()), float(lengths.mean()),
                       float(np.median(lengths)), float(np.percentile(lengths, 99)))


def log2_buckets(lengths: npt.NDArray[np.int64]) -> list[tuple[int, int, int]]:
    """``(lo, hi, count)`` for each bucket from the smallest to the largest non-empty one."""
    zeros = int((lengths == 0).sum())
    positive = lengths[lengths > 0]
    out = [(0, 0, zeros)] if zeros else []
    if len(positive):
        exps = np.frexp(positive.astype(np.float64))[1] - 1  # floor(log2(x)), exact
        counts = np.bincount(exps)
        first = int(exps.min())
        out += [(1 << b, (1 << (b + 1)) - 1, int(counts[b]))
                for b in range(first, len(counts))]
    return out
