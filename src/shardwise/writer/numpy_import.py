"""OLMo's token arrays → cache: flat arrays of token ids, documents ended by an EOS id.

OLMo-core (and the Dolma toolkit) store a corpus as files of concatenated token ids, each
document followed by the EOS id; OLMo finds the documents by scanning for it
(``olmo_core.data.utils.iter_document_indices``). :func:`from_numpy` cuts each file the
same way, the EOS kept as the document's last token, and imports the documents through
the one import writer (:func:`shardwise.writer.megatron_import.import_sources`: chunks of
whole documents, manifest, ledger), one source per file::

    tokens  5 9 2 | 7 2 | 4 4 8   (eos = 2)  →  documents [5 9 2] [7 2] [4 4 8]

Tokens after the last EOS (a file that does not end with it) become one last document,
without an EOS, and the summary says so: every token of the array is in the cache (OLMo
itself would leave them out). A file is a ``.npy`` (with its header; read memory-mapped)
or, like Dolma's ``.npy`` files, a raw memory map with no header (``dtype=`` needed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError
from shardwise.format.checksum import file_checksum
from shardwise.format.manifest import SourceInfo
from shardwise.format.megatron import dtype_code
from shardwise.writer.convert import IMPORT_KIND, ConvertSummary
from shardwise.writer.megatron_import import TokenSource, import_sources

NPY_MAGIC = b"\x93NUMPY"
_SCAN_TOKENS = 1 << 24  # tokens scanned for EOS at a time: bounded memory


def from_numpy(paths: list[str | os.PathLike[str]], out_dir: str | os.PathLike[str], *,
               eos: int, dtype: str | None = None, chunk_docs: int | None = None,
               chunk_mb: float = 64) -> ConvertSummary:
    """Import token arrays ``paths`` (in order) as a cache in ``out_dir``, documents split
    after each ``eos``; ``dtype``: of raw arrays (a ``.npy`` header's wins, and must
    agree). The cache's EOD id is ``eos``."""
    if not paths:
        raise ConfigError("--from-numpy needs at least one token array")
    eos = _eos_id(eos)
    arrays = [_open(Path(p), dtype) for p in paths]
    notes = []
    sources = []
    for path, arr in arrays:
        src, tail = _source(path, arr, eos)
        sources.append(src)
        if src.dtype != arr.dtype:
            notes.append(f"{path}: {arr.dtype} ids stored as {src.dtype} (Megatron's "
                         f"format has no {arr.dtype}); read back as {arr.dtype} they are equal")
        if tail:
            notes.append(f"{path}: {tail:,} tokens after the last EOS ({eos}) became a last "
                         "document without EOS")
    processor = {"kind": IMPORT_KIND, "from": "numpy", "eos": eos}
    return import_sources(sources, out_dir, processor=processor, eod_id=eos,
                          chunk_docs=chunk_docs, chunk_mb=chunk_mb, notes=notes)


def _eos_id(eos: Any) -> int:
    if isinstance(eos, bool) or not isinstance(eos, (int, np.integer)) or eos < 0:
        raise ConfigError(f"eos must be a non-negative token id, got {eos!r}")
    return int(eos)


def _open(path: Path, dtype: str | None) -> tuple[Path, npt.NDArray[Any]]:
    """The array of ``path``, memory-mapped: a ``.npy`` by its header, else raw."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; --from-numpy takes token array files")
    with open(path, "rb") as f:
        is_npy = f.read(len(NPY_MAGIC)) == NPY_MAGIC
    if is_npy:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        if arr.ndim != 1:
            raise ConfigError(f"{path}: a {arr.ndim}-d array of shape {arr.shape}; a token "
                              "array is flat (1-d)")
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            raise ConfigError(f"{path}: its header says {arr.dtype}, but --dtype {dtype} was "
                              "given; drop --dtype for .npy files with a header")
    else:
        if dtype is None:
            raise ConfigError(f"{path}: a raw array (no .npy header, as Dolma writes them); "
                              "say its dtype: --dtype uint32 (e.g. OLMo's dolma2 tokenizer) "
                              "or --dtype uint16")
        dt = np.dtype(dtype)
        size = path.stat().st_size
        if size % dt.itemsize:
            raise ConfigError(f"{path}: {size} bytes is not a whole number of {dt.name} "
                              f"tokens ({dt.itemsize} bytes each); is --dtype right?")
        arr = (np.memmap(path, dtype=dt, mode="r") if size else np.zeros(0, dtype=dt))
    if arr.dtype.kind not in "iu":
        raise ConfigError(f"{path}: dtype {arr.dtype} holds no token ids")
    return path, arr


def store_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a chunk stores ``dtype``'s ids in: itself, or for uint32/uint64 (which
    Megatron's format has no code for; OLMo's dolma2 arrays are uint32) the signed type of
    the same size, as Megatron stores vocabularies over 65,536 (an id past its range is
    refused as negative)."""
    signed = np.dtype(f"int{dtype.itemsize * 8}") if dtype.kind == "u" else dtype
    try:
        dtype_code(dtype)
        return dtype
    except ConfigError:
        dtype_code(signed)  # a named error if neither fits
        return signed


def _source(path: Path, arr: npt.NDArray[Any], eos: int) -> tuple[TokenSource, int]:
    """The documents of ``arr`` (ends after each EOS) as a :class:`TokenSource`, and the
    count of tokens after the last EOS (the last document's, then)."""
    ends = _eos_ends(arr, eos)
    tail = len(arr) - (int(ends[-1]) if len(ends) else 0)
    if tail:
        ends = np.append(ends, len(arr))
    starts = np.concatenate([np.zeros(min(len(ends), 1), np.int64), ends[:-1]])
    info = SourceInfo(path=str(path.resolve()), size=path.stat().st_size,
                      fingerprint=file_checksum(path), format="numpy")
    dtype = store_dtype(arr.dtype)

    def read(start: int, count: int) -> npt.NDArray[Any]:
        return np.asarray(arr[start:start + count]).astype(dtype, copy=False)

    return TokenSource(path, dtype, starts, ends - starts, read, info), tail


def _eos_ends(arr: npt.NDArray[Any], eos: int) -> npt.NDArray[np.int64]:
    """One past each EOS position (each document's end), scanning in bounded blocks."""
    parts = [np.flatnonzero(arr[i:i + _SCAN_TOKENS] == eos).astype(np.int64) + i + 1
             for i in range(0, len(arr), _SCAN_TOKENS)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


__all__ = ["from_numpy"]
