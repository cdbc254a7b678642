"""Token arrays → cache: import one ``prefix.bin`` + ``prefix.idx`` (or any flat token
array cut into documents, :class:`TokenSource`) as a chunked shardwise cache.

``from_megatron`` cuts a prefix into chunks of whole documents (one segment per chunk,
``start``/``stop`` = document numbers), so the round trip
cache → Megatron → cache → Megatron reproduces the Megatron files byte for byte.

Why its own module: this direction *builds a cache* (chunks published, a manifest and a
ledger written, as a build does); the other (:mod:`shardwise.writer.convert`) only reads
one and writes Megatron's files. They share :class:`~shardwise.writer.convert.ConvertSummary`
and ``IMPORT_KIND``, the manifest's mark of an imported cache (which has no build to rerun).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise._version import __version__
from shardwise.errors import ConfigError
from shardwise.format.checksum import file_checksum
from shardwise.format.chunk import ChunkKind, SourceRange, chunk_stem, publish_token_chunk
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress
from shardwise.format.manifest import Manifest, SourceInfo, TokenizerInfo, manifest_checksum
from shardwise.format.megatron import MegatronIndex, check_index, read_idx
from shardwise.storage.local import LocalStore
from shardwise.storage.verify_report import with_suffix
from shardwise.writer.convert import IMPORT_KIND, ConvertSummary

_SCAN_DOCS = 1 << 20


@dataclass(frozen=True)
class TokenSource:
    """One flat token array to import, cut into documents: what both imports (a Megatron
    prefix, OLMo's token arrays: :mod:`shardwise.writer.numpy_import`) hand the one
    writer below. ``starts``/``lengths``: each document's first token and token count;
    ``read(start, count)``: ``count`` tokens from token offset ``start`` (bounded: one
    chunk's worth at a time); ``info``: the manifest's record of the file."""

    path: Path
    dtype: np.dtype[Any]
    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.integer[Any]]
    read: Callable[[int, int], npt.NDArray[Any]]
    info: SourceInfo


def import_sources(sources: list[TokenSource], out_dir: str | os.PathLike[str], *,
                   processor: dict[str, Any], eod_id: int | None = None,
                   chunk_docs: int | None = None, chunk_mb: float = 64,
                   notes: list[str] | None = None) -> ConvertSummary:
    """Publish each source's documents as chunks of whole documents (source ``s``, one
    segment per chunk), then the manifest and the ledger: a cache in ``out_dir``.

    Chunks hold ``chunk_docs`` documents each, or else close once they reach ``chunk_mb``
    MiB of tokens. The manifest is written last, so an interrupted import is not a cache
    (remove the directory and run again)."""
    started, out = time.monotonic(), Path(out_dir)
    if chunk_docs is not None and chunk_docs <= 0:
        raise ConfigError(f"chunk_docs must be positive, got {chunk_docs}")
    max_bytes = None if chunk_docs is not None else _positive_bytes(chunk_mb)
    if len({src.dtype for src in sources}) > 1:
        raise ConfigError("the token arrays have different dtypes "
                          f"({sorted({src.dtype.name for src in sources})}); a cache has one")
    _check_out_dir(out)
    files, progress, top = LocalStore(out), [], -1
    for s, src in enumerate(sources):
        segments = []
        for g, (a, b) in enumerate(_doc_ranges(src.lengths, src.dtype.itemsize, chunk_docs,
                                               max_bytes)):
            seg, chunk_top = _publish_range(files, src, s, g, a, b)
            segments.append(seg)
            top = max(top, chunk_top)
        progress.append(SourceProgress(segments or [Segment(start=0, stop=0, position=0,
                                                            finished=True)]))
    dtype = sources[0].dtype
    _import_manifest(sources, dtype, top, eod_id, processor, chunk_docs, max_bytes).save(files)
    Ledger(progress, manifest_xxh3=manifest_checksum(files)).save(files)
    docs = sum(len(src.lengths) for src in sources)
    tokens = sum(int(np.sum(src.lengths, dtype=np.int64)) for src in sources)
    n_chunks = sum(len(seg.chunks) for p in progress for seg in p.segments)
    return ConvertSummary(str(out), n_chunks, docs, tokens, tokens * dtype.itemsize,
                          dtype.name, time.monotonic() - started, notes or [])


def from_megatron(prefix: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                  chunk_docs: int | None = None, chunk_mb: float = 64) -> ConvertSummary:
    """Import ``prefix.bin``/``prefix.idx`` as a chunked shardwise cache in ``out_dir``.

    Chunks hold ``chunk_docs`` documents each, or else close once they reach
    ``chunk_mb`` MiB of tokens. Each Megatron *sequence* becomes one document. The
    manifest is written last, so an interrupted import is not a cache (remove the
    directory and run again).
    """
    prefix = Path(prefix)
    index = _source_index(prefix)
    info = SourceInfo(path=str(prefix.resolve()),
                      size=with_suffix(prefix, ".bin").stat().st_size,
                      fingerprint=file_checksum(with_suffix(prefix, ".idx")), format="megatron")
    with open(with_suffix(prefix, ".bin"), "rb") as bin_file:  # read per chunk: bounded memory
        def read(start: int, count: int) -> npt.NDArray[Any]:
            bin_file.seek(start * index.dtype.itemsize)
            return np.fromfile(bin_file, dtype=index.dtype, count=count)

        src = TokenSource(prefix, index.dtype,
                          index.sequence_pointers // index.dtype.itemsize,
                          index.sequence_lengths, read, info)
        return import_sources([src], out_dir, processor={"kind": IMPORT_KIND},
                              chunk_docs=chunk_docs, chunk_mb=chunk_mb,
                              notes=_import_notes(index))


def _source_index(prefix: Path) -> MegatronIndex:
    idx_path, bin_path = with_suffix(prefix, ".idx"), with_suffix(prefix, ".bin")
    for p in (idx_path, bin_path):
        if not p.is_file():
            raise ConfigError(f"{p}: missing; --from-megatron takes the prefix of a "
                              f"'.bin'/'.idx' pair (e.g. data/corpus_text_document)")
    index = read_idx(idx_path)
    check_index(index, bin_path)
    if index.dtype.kind not in "iu":
        raise ConfigError(f"{idx_path}: dtype {index.dtype} holds no token ids")
    return index


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty directory; choose a new "
                          "directory (an interrupted import can be removed and rerun)")
    out.mkdir(parents=True, exist_ok=True)


def _positive_bytes(chunk_mb: float) -> int:
    if not chunk_mb > 0:
        raise ConfigError(f"chunk_mb must be positive, got {chunk_mb}")
    return max(1, int(chunk_mb * (1 << 20)))


def _doc_ranges(lengths: npt.NDArray[np.integer[Any]], itemsize: int, chunk_docs: int | None,
                max_bytes: int | None) -> Iterator[tuple[int, int]]:
    """Document ranges ``[a, b)`` of each chunk: ``chunk_docs`` at a time, or the fewest
    documents reaching ``max_bytes`` (at least one). Scans lengths in growing blocks."""
    n = len(lengths)
    start = 0
    while start < n:
        if chunk_docs is not None:
            stop = min(start + chunk_docs, n)
        elif max_bytes is not None:
            stop = _fill(lengths, start, itemsize, max_bytes)
        else:
            stop = n
        yield start, stop
        start = stop


def _fill(lengths: npt.NDArray[np.integer[Any]], start: int, itemsize: int, max_bytes: int) -> int:
    total, pos, block = 0, start, 4096
    while pos < len(lengths):
        cum = total + np.cumsum(lengths[pos:pos + block], dtype=np.int64) * itemsize
        k = int(np.searchsorted(cum, max_bytes))  # first document reaching max_bytes
        if k < len(cum):
            return pos + k + 1
        total, pos, block = int(cum[-1]), pos + len(cum), min(block * 2, _SCAN_DOCS)
    return len(lengths)


def _publish_range(out: LocalStore, src: TokenSource, s: int, g: int, a: int,
                   b: int) -> tuple[Segment, int]:
    """Publish documents ``[a, b)`` of source ``s`` as chunk 0 of segment ``g``; return it
    and its max id."""
    lengths = np.asarray(src.lengths[a:b], dtype=np.int64)
    part = src.read(int(src.starts[a]) if b > a else 0, int(lengths.sum()))
    fields = {"source": s, "source_path": str(src.path), "segment": g, "index": 0,
              "range": SourceRange("row", a, b, 0, b - a)}
    meta, digest = publish_token_chunk(out, chunk_stem(s, g, 0), part, lengths, fields)
    top = -1
    if len(part):
        if int(part.min()) < 0:
            raise ConfigError(f"{src.path}: negative token id in documents [{a}, {b}); not "
                              "a token dataset")
        top = int(part.max())
    entry = ChunkEntry(meta.stem, meta.documents, meta.tokens, digest,
                       empty=int(np.count_nonzero(lengths == 0)))
    seg = Segment(start=a, stop=b, position=b, line=b - a, finished=True, chunks=[entry])
    return seg, top


def _import_manifest(sources: list[TokenSource], dtype: np.dtype[Any], top: int,
                     eod_id: int | None, processor: dict[str, Any], chunk_docs: int | None,
                     max_bytes: int | None) -> Manifest:
    """Vocabulary = largest id + 1 (the dtype's range for an empty import)."""
    vocab = top + 1 if top >= 0 else int(np.iinfo(dtype).max) + 1
    if eod_id is not None:
        vocab = max(vocab, eod_id + 1)
    return Manifest(tokenizer=TokenizerInfo("unknown", vocab, eod_id), dtype=dtype.name,
                    chunk_kind=ChunkKind.TOKENS.value, processor=processor,
                    chunking={"max_docs": chunk_docs, "max_bytes": max_bytes,
                              "segment_bytes": None},
                    sources=[src.info for src in sources], created_by=f"shardwise {__version__}")


def _import_notes(index: MegatronIndex) -> list[str]:
    """Say so when Megatron documents span several sequences: each became a document."""
    docs = index.document_indices
    if len(docs) == index.num_sequences + 1:
        return []
    return [f"{index.path}: {len(docs) - 1} Megatron documents of {index.num_sequences} "
            "sequences; each sequence became one shardwise document"]


__all__ = ["TokenSource", "from_megatron", "import_sources"]
