"""Cache → Megatron: merge a shardwise cache into one ``prefix.bin`` + ``prefix.idx``, or
name its chunks as Megatron's ``--data-path``.

``to_megatron`` concatenates the visible chunks in global order: the ``.bin`` is the
chunks' ``.bin`` files copied in blocks, the ``.idx`` is streamed section by section
(lengths, then pointers shifted by the bytes before each chunk, then document indices
shifted by the sequences before it), so memory stays constant however big the cache::

    chunk a: lengths [3, 1]  pointers [0, 6]     chunk b: lengths [2]  pointers [0]
    merged:  lengths [3, 1, 2]  pointers [0, 6, 8]  document indices [0, 1, 2, 3]

The other direction, Megatron → cache, builds a cache:
:mod:`shardwise.writer.megatron_import` (``from_megatron``), which reports with the same
:class:`ConvertSummary`.
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

from shardwise.checkpoint import as_count
from shardwise.errors import CacheError, ConfigError, CorruptChunkError
from shardwise.format.atomic import fsync_dir, temp_path
from shardwise.format.checksum import copy_checksum
from shardwise.format.chunk import ChunkKind
from shardwise.format.ledger import ChunkEntry
from shardwise.format.manifest import (
    MANIFEST_NAME,
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
from shardwise.storage.opening import open_cache

_COPY_BLOCK = 8 << 20

# the manifest processor kind of a cache imported from Megatron (writer/megatron_import.py
# writes it; a damaged chunk of such a cache has no build to rerun)
IMPORT_KIND = "megatron-import"


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
