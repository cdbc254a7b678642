"""Convert between a shardwise cache and one Megatron ``prefix.bin`` + ``prefix.idx``.

``to_megatron`` concatenates the visible chunks in global order: the ``.bin`` is the
chunks' ``.bin`` files copied in blocks, the ``.idx`` is streamed section by section
(lengths, then pointers shifted by the bytes before each chunk, then document indices
shifted by the sequences before it), so memory stays constant however big the cache::

    chunk a: lengths [3, 1]  pointers [0, 6]     chunk b: lengths [2]  pointers [0]
    merged:  lengths [3, 1, 2]  pointers [0, 6, 8]  document indices [0, 1, 2, 3]

``from_megatron`` cuts a prefix into chunks of whole documents (one segment per chunk,
``start``/``stop`` = document numbers), so the round trip
cache → Megatron → cache → Megatron reproduces the Megatron files byte for byte.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from shardwise._version import __version__
from shardwise.checkpoint import as_count
from shardwise.errors import CacheError, ConfigError, CorruptChunkError
from shardwise.format.atomic import fsync_dir, temp_path
from shardwise.format.checksum import copy_checksum, file_checksum
from shardwise.format.chunk import ChunkKind, SourceRange, chunk_stem, publish_token_chunk
from shardwise.format.ledger import ChunkEntry, Ledger, Segment, SourceProgress
from shardwise.format.manifest import (
    MANIFEST_NAME,
    Manifest,
    SourceInfo,
    TokenizerInfo,
    manifest_checksum,
)
from shardwise.format.megatron import (
    MAGIC,
    VERSION,
    MegatronIndex,
    check_index,
    dtype_code,
    read_idx,
)
from shardwise.storage.cache import Cache
from shardwise.storage.chunk_check import CheckDepth, ChunkExpect, check_chunk
from shardwise.storage.local import LocalStore
from shardwise.storage.opening import open_cache

_COPY_BLOCK = 8 << 20
_SCAN_DOCS = 1 << 20

IMPORT_KIND = "megatron-import"  # manifest processor kind of a cache imported from Megatron


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion wrote."""

    path: str
    chunks: int
    documents: int
    tokens: int
    bytes: int
    dtype: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


def _with(base: Path, suffix: str) -> Path:
    return base.with_name(base.name + suffix)


# ---------------------------------------------------------------- cache -> Megatron


def to_megatron(cache_root: str | os.PathLike[str], prefix: str | os.PathLike[str], *,
                allow_partial: bool = False, verify: bool = True) -> ConvertSummary:
    """Merge a cache's visible chunks into ``prefix.bin`` + ``prefix.idx``.

    Refuses a cache still being built (its global order may still grow) unless
    ``allow_partial``; then only the visible prefix is written. ``verify`` (default on):
    refuse a chunk whose ``.json``, ``.idx`` or ``.bin`` is not the one published (its
    xxh3_64 against the ledger / metadata; the ``.bin`` hashed as it is copied, so the
    check costs no second read); False copies what is on disk, as ``--no-verify`` does
    elsewhere. Both files are written to temporary names, fsynced and renamed, ``.bin``
    first; a refusal leaves neither. Chunk indexes are re-opened per pass rather than
    held, so a cache of 100k chunks never holds 100k memory maps.
    """
    started = time.monotonic()
    cache = _open_token_cache(cache_root, allow_partial)
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    targets = [_with(prefix, ".bin"), _with(prefix, ".idx")]
    temps = [temp_path(p) for p in targets]
    try:
        with open(temps[0], "wb") as f:
            n_doc = 1
            for i in range(len(cache.chunks)):
                want = _check_small_files(cache, i) if verify else None
                index = _chunk_index(cache, i)
                _copy_bin(cache, i, index, f, want)
                n_doc += len(index.document_indices) - 1
            _sync(f)
        with open(temps[1], "wb") as f:
            _write_merged_idx(cache, n_doc, f)
            _sync(f)
        for tmp, final in zip(temps, targets, strict=True):
            os.replace(tmp, final)
        fsync_dir(prefix.parent)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    notes = [] if cache.finished else [f"partial: the cache is still being built; wrote the "
                                       f"{len(cache.chunks)} visible chunks"]
    return ConvertSummary(str(prefix), len(cache.chunks), cache.num_documents,
                          cache.num_tokens, targets[0].stat().st_size, cache.dtype.name,
                          time.monotonic() - started, notes)


def _open_token_cache(root: str | os.PathLike[str], allow_partial: bool) -> Cache:
    cache = open_cache(root) if (Path(root) / MANIFEST_NAME).is_file() else None
    if cache is None or cache.manifest is None:
        raise ConfigError(f"{root}: not a shardwise cache (no {MANIFEST_NAME}); "
                          "--to-megatron converts a cache directory")
    if cache.manifest.chunk_kind != ChunkKind.TOKENS.value:
        raise ConfigError(f"{root}: a {cache.manifest.chunk_kind} cache (Parquet records) has "
                          "no Megatron form; only token caches convert")
    if not cache.finished and not allow_partial:
        raise CacheError(f"{root}: the cache is still being built ({len(cache.chunks)} chunks "
                         "visible so far); wait for the build to finish, or pass "
                         "allow_partial=True (--allow-partial) to convert the visible prefix")
    return cache


def _chunk_index(cache: Cache, i: int) -> MegatronIndex:
    """Chunk ``i``'s index, checked against its ``.bin``, the manifest and the ledger."""
    base = cache.chunks[i].base
    index = read_idx(_with(base, ".idx"))
    check_index(index, _with(base, ".bin"))
    if index.dtype != cache.dtype:
        raise CorruptChunkError(f"{index.path}: dtype {index.dtype}, the manifest says "
                                f"{cache.dtype}; run 'shardwise verify {cache.root}'")
    if index.num_sequences != cache.chunks[i].documents:
        raise CorruptChunkError(f"{index.path}: {index.num_sequences} documents, the ledger "
                                f"says {cache.chunks[i].documents}; run 'shardwise verify "
                                f"{cache.root}'")
    return index


def _check_small_files(cache: Cache, i: int) -> str:
    """Chunk ``i``'s ``.json`` (against the ledger) and ``.idx`` (hashed) by the one
    chunk check, its ``.bin``'s size; returns the ``.bin``'s published xxh3_64."""
    info = cache.chunks[i]
    entry = ChunkEntry(info.stem, info.documents, info.tokens, info.meta_xxh3)
    report = check_chunk(ChunkExpect(cache.root, info.source, entry, info.kind, cache.dtype),
                         depth=CheckDepth.CHECKSUMS, suffixes=(".idx",))
    if not report.ok:
        found = "; ".join(f"{p.path}: {p.what}" for p in report.problems)
        raise CorruptChunkError(f"{found}; {_repair_advice(cache)}")
    return str(cache.meta(i).files[".bin"]["xxh3_64"])


def _repair_advice(cache: Cache) -> str:
    """A rerun of the build rebuilds a damaged chunk in place; an import has no build."""
    imported = cache.manifest is not None and cache.manifest.processor.get("kind") == IMPORT_KIND
    fix = ("restore it from a copy" if imported else
           "rerun the same build command to rebuild it (or restore it from a copy)")
    return (f"nothing was written; run 'shardwise verify {cache.root}' to list all damage, "
            f"then {fix}, and convert again")


def _copy_bin(cache: Cache, i: int, index: MegatronIndex, out: BinaryIO,
              want: str | None) -> None:
    """Append chunk ``i``'s ``.bin`` to ``out``; its xxh3_64 must be ``want`` (if given)."""
    path = _with(cache.chunks[i].base, ".bin")
    n, got = copy_checksum(path, out)
    if n != index.num_tokens * index.dtype.itemsize:
        raise CorruptChunkError(f"{path}: {n} bytes, its index promises "
                                f"{index.num_tokens * index.dtype.itemsize}")
    if want is not None and got != want:
        raise CorruptChunkError(f"{path}: xxh3_64 {got}, the metadata says {want}; "
                                f"{_repair_advice(cache)}")


def _write_merged_idx(cache: Cache, n_doc: int, out: BinaryIO) -> None:
    """Header, then each section streamed chunk by chunk (see the module docstring)."""
    def indexes() -> Iterator[MegatronIndex]:
        return (read_idx(_with(c.base, ".idx")) for c in cache.chunks)

    out.write(MAGIC + struct.pack("<QBQQ", VERSION, dtype_code(cache.dtype),
                                  cache.num_documents, n_doc))
    for ix in indexes():
        out.write(ix.sequence_lengths.tobytes())
    byte_offset = 0
    for ix in indexes():
        out.write((ix.sequence_pointers + byte_offset).tobytes())
        byte_offset += ix.num_tokens * cache.dtype.itemsize
    seq_offset = 0
    for ix in indexes():
        out.write((ix.document_indices[:-1] + seq_offset).tobytes())
        seq_offset += ix.num_sequences
    out.write(np.array([seq_offset], dtype=np.int64).tobytes())


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


# ---------------------------------------------------------------- cache -> --data-path


@dataclass(frozen=True)
class DataPath:
    """A cache as Megatron's ``--data-path``: ``tokens prefix`` per non-empty chunk.

    Megatron's builder packs each prefix on its own, so a window never spans two chunks:
    with ``seq_len``, ``windows`` is what one merged prefix (``to_megatron``) or
    ``shardwise.megatron`` packs, ``windows_per_chunk`` what the chunk list gives::

        chunks of 40 and 30 tokens, seq_len 16: (70-1)//16 = 4 windows, 2 + 1 = 3 per chunk
    """

    items: list[str]
    chunks: int
    tokens: int
    seq_len: int | None = None
    windows: int | None = None
    windows_per_chunk: int | None = None

    @property
    def lost_windows(self) -> int | None:
        if self.windows is None or self.windows_per_chunk is None:
            return None
        return self.windows - self.windows_per_chunk

    def to_dict(self) -> dict[str, object]:
        return {**vars(self), "lost_windows": self.lost_windows}


def megatron_data_path(cache_root: str | os.PathLike[str], *, seq_len: int | None = None,
                       allow_partial: bool = False) -> DataPath:
    """The weighted chunk-prefix list that hands a cache to Megatron's own builder
    (weights = tokens, so each chunk is sampled as its share of the cache), and what
    packing per chunk loses against one prefix."""
    cache = _open_token_cache(cache_root, allow_partial)
    if seq_len is not None:
        seq_len = as_count(seq_len, "seq_len", minimum=1, error=ConfigError)
    used = [c for c in cache.chunks if c.tokens > 0]  # Megatron cannot pack an empty prefix
    items = [x for c in used for x in (str(c.tokens), str(c.base.resolve()))]
    windows = per_chunk = None
    if seq_len is not None:
        windows = max(0, cache.num_tokens - 1) // seq_len
        per_chunk = sum((c.tokens - 1) // seq_len for c in used)
    return DataPath(items, len(used), cache.num_tokens, seq_len, windows, per_chunk)


# ---------------------------------------------------------------- Megatron -> cache


def from_megatron(prefix: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                  chunk_docs: int | None = None, chunk_mb: float = 64) -> ConvertSummary:
    """Import ``prefix.bin``/``prefix.idx`` as a chunked shardwise cache in ``out_dir``.

    Chunks hold ``chunk_docs`` documents each, or else close once they reach
    ``chunk_mb`` MiB of tokens. Each Megatron *sequence* becomes one document. The
    manifest is written last, so an interrupted import is not a cache (remove the
    directory and run again).
    """
    started = time.monotonic()
    prefix, out = Path(prefix), Path(out_dir)
    if chunk_docs is not None and chunk_docs <= 0:
        raise ConfigError(f"chunk_docs must be positive, got {chunk_docs}")
    max_bytes = None if chunk_docs is not None else _positive_bytes(chunk_mb)
    index = _source_index(prefix)
    _check_out_dir(out)
    files, segments, top = LocalStore(out), [], -1
    with open(_with(prefix, ".bin"), "rb") as bin_file:  # read per chunk: bounded memory
        for g, (a, b) in enumerate(_doc_ranges(index.sequence_lengths, index.dtype.itemsize,
                                               chunk_docs, max_bytes)):
            seg, chunk_top = _publish_range(files, prefix, index, bin_file, g, a, b)
            segments.append(seg)
            top = max(top, chunk_top)
    if not segments:
        segments = [Segment(start=0, stop=0, position=0, finished=True)]
    _import_manifest(prefix, index, top, chunk_docs, max_bytes).save(files)
    Ledger([SourceProgress(segments)], manifest_xxh3=manifest_checksum(files)).save(files)
    notes = _import_notes(index)
    n_chunks = sum(len(s.chunks) for s in segments)
    return ConvertSummary(str(out), n_chunks, index.num_sequences, index.num_tokens,
                          index.num_tokens * index.dtype.itemsize, index.dtype.name,
                          time.monotonic() - started, notes)


def _source_index(prefix: Path) -> MegatronIndex:
    idx_path, bin_path = _with(prefix, ".idx"), _with(prefix, ".bin")
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


def _doc_ranges(lengths: npt.NDArray[np.int32], itemsize: int, chunk_docs: int | None,
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


def _fill(lengths: npt.NDArray[np.int32], start: int, itemsize: int, max_bytes: int) -> int:
    total, pos, block = 0, start, 4096
    while pos < len(lengths):
        cum = total + np.cumsum(lengths[pos:pos + block], dtype=np.int64) * itemsize
        k = int(np.searchsorted(cum, max_bytes))  # first document reaching max_bytes
        if k < len(cum):
            return pos + k + 1
        total, pos, block = int(cum[-1]), pos + len(cum), min(block * 2, _SCAN_DOCS)
    return len(lengths)


def _publish_range(out: LocalStore, prefix: Path, index: MegatronIndex, bin_file: BinaryIO,
                   g: int, a: int, b: int) -> tuple[Segment, int]:
    """Publish documents ``[a, b)`` as chunk 0 of segment ``g``; return it and its max id."""
    lengths = index.sequence_lengths[a:b].astype(np.int64)
    bin_file.seek(int(index.sequence_pointers[a]) if b > a else 0)
    part = np.fromfile(bin_file, dtype=index.dtype, count=int(lengths.sum()))
    fields = {"source": 0, "source_path": str(prefix), "segment": g, "index": 0,
              "range": SourceRange("row", a, b, 0, b - a)}
    meta, digest = publish_token_chunk(out, chunk_stem(0, g, 0), part, lengths, fields)
    top = -1
    if len(part):
        if int(part.min()) < 0:
            raise ConfigError(f"{_with(prefix, '.bin')}: negative token id in documents "
                              f"[{a}, {b}); not a token dataset")
        top = int(part.max())
    entry = ChunkEntry(meta.stem, meta.documents, meta.tokens, digest,
                       empty=int(np.count_nonzero(lengths == 0)))
    seg = Segment(start=a, stop=b, position=b, line=b - a, finished=True, chunks=[entry])
    return seg, top


def _import_manifest(prefix: Path, index: MegatronIndex, top: int, chunk_docs: int | None,
                     max_bytes: int | None) -> Manifest:
    """Vocabulary = largest id + 1 (the dtype's range for an empty dataset)."""
    vocab = top + 1 if top >= 0 else int(np.iinfo(index.dtype).max) + 1
    bin_path = _with(prefix, ".bin")
    source = SourceInfo(path=str(prefix.resolve()), size=bin_path.stat().st_size,
                        fingerprint=file_checksum(_with(prefix, ".idx")), format="megatron")
    return Manifest(tokenizer=TokenizerInfo("unknown", vocab, None), dtype=index.dtype.name,
                    chunk_kind=ChunkKind.TOKENS.value, processor={"kind": IMPORT_KIND},
                    chunking={"max_docs": chunk_docs, "max_bytes": max_bytes,
                              "segment_bytes": None},
                    sources=[source], created_by=f"shardwise {__version__}")


def _import_notes(index: MegatronIndex) -> list[str]:
    """Say so when Megatron documents span several sequences: each became a document."""
    docs = index.document_indices
    if len(docs) == index.num_sequences + 1:
        return []
    return [f"{index.path}: {len(docs) - 1} Megatron documents of {index.num_sequences} "
            "sequences; each sequence became one shardwise document"]
