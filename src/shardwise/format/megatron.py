"""Megatron-LM IndexedDataset ``.bin/.idx`` files, byte for byte.

``.idx`` layout (all little-endian)::

    b"MMIDIDX\\x00\\x00"     9-byte magic
    u64  version = 1
    u8   dtype code           1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                              6 float64, 7 float32, 8 uint16
    u64  sequence count  S
    u64  document count  D    (= number of documents + 1)
    i32[S] sequence lengths   (in tokens)
    i64[S] sequence pointers  (byte offsets into .bin)
    i64[D] document indices   (sequence index where each document starts; starts at 0)

``.bin`` is the token ids of every sequence, concatenated. shardwise writes one sequence
per document, so document indices are ``0, 1, …, S``. Example: documents ``[5, 6, 7]``
and ``[8]`` in uint16 give lengths ``[3, 1]``, pointers ``[0, 6]``, document indices
``[0, 1, 2]`` and an 8-byte ``.bin``.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError, CorruptChunkError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8
_CHECK_BLOCK = 1 << 20

DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


def dtype_code(dtype: npt.DTypeLike) -> int:
    """The Megatron code of a numpy dtype."""
    dt = np.dtype(dtype)
    for code, candidate in DTYPE_CODES.items():
        if np.dtype(candidate) == dt:
            return code
    raise ConfigError(f"dtype {dt} has no Megatron code; use one of "
                      f"{[np.dtype(d).name for d in DTYPE_CODES.values()]}")


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest dtype holding every id below ``vocab_size``: uint16 up to 65,536 ids, else int32."""
    if vocab_size <= 0:
        raise ConfigError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def first_bad_id(ids: npt.NDArray[Any], vocab_size: int | None) -> int:
    """Flat index of the first id outside ``[0, vocab_size)``, or -1.

    One reduction: signed ids are viewed as unsigned, so a negative id becomes huge and
    fails the same ``max < vocab_size`` test. ``vocab_size`` None (a Megatron dataset)
    or above the dtype's range: nothing to check."""
    if (vocab_size is None or ids.size == 0 or ids.dtype.kind not in "iu"
            or vocab_size >> (8 * ids.dtype.itemsize)):  # every value of the dtype is valid
        return -1
    unsigned = ids if ids.dtype.kind == "u" else ids.view(f"u{ids.dtype.itemsize}")
    if unsigned.max() < vocab_size:
        return -1
    return int(np.flatnonzero(unsigned.reshape(-1) >= vocab_size)[0])


def idx_bytes(sequence_lengths: npt.ArrayLike, dtype: npt.DTypeLike,
              document_indices: npt.ArrayLike | None = None) -> bytes:
    """The ``.idx`` file for sequences of the given lengths (one document per sequence
    unless ``document_indices`` says otherwise)."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= itemsize
    if document_indices is None:
        docs = np.arange(len(lengths) + 1, dtype=np.int64)
    else:
        docs = np.asarray(document_indices, dtype=np.int64)
    header = (MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", dtype_code(dtype))
              + struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(docs)))
    return header + lengths.tobytes() + pointers.tobytes() + docs.tobytes()


@dataclass(frozen=True)
class MegatronIndex:
    """A parsed ``.idx``: arrays are views of a read-only memory map (nothing copied)."""

    path: Path
    dtype: np.dtype
    sequence_lengths: npt.NDArray[np.int32]
    sequence_pointers: npt.NDArray[np.int64]
    document_indices: npt.NDArray[np.int64]

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    @property
    def num_documents(self) -> int:
        """Megatron's documents (``document_indices`` minus its closing entry); a document
        may hold several sequences (``preprocess_data.py --split-sentences``)."""
        return len(self.document_indices) - 1

    @property
    def document_lengths(self) -> npt.NDArray[np.integer]:
        """Tokens per document: the sequence lengths themselves when every document is one
        sequence (a view, nothing read), else the sum of each document's sequences::

            sequence_lengths [3, 1, 2]  document_indices [0, 2, 3]  →  [4, 2]
        """
        if self.num_documents == self.num_sequences:
            return self.sequence_lengths
        cum = np.zeros(self.num_sequences + 1, dtype=np.int64)
        np.cumsum(self.sequence_lengths, dtype=np.int64, out=cum[1:])
        return np.diff(cum[self.document_indices])


def _corrupt(path: Path, what: str) -> CorruptChunkError:
    return CorruptChunkError(f"{path}: {what}; run 'shardwise verify' on the cache "
                             "or rebuild this file")


def idx_header(head: bytes, size: int, path: Path) -> tuple[np.dtype, int, int]:
    """The dtype, sequence count and document-index count of an ``.idx`` whose first
    ``HEADER_SIZE`` bytes are ``head`` and whose size is ``size``; a bad magic, version or
    dtype code, or a size the header does not promise, is a :class:`CorruptChunkError`."""
    if size < HEADER_SIZE or len(head) < HEADER_SIZE:
        raise _corrupt(path, f"file is {size} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic = bytes(head[: len(MAGIC)])
    if magic != MAGIC:
        raise _corrupt(path, f"bad magic {magic!r}, expected {MAGIC!r}")
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", head, len(MAGIC))
    if version != VERSION:
        raise _corrupt(path, f"version {version}, expected {VERSION}")
    if code not in DTYPE_CODES:
        raise _corrupt(path, f"unknown dtype code {code}, expected one of {sorted(DTYPE_CODES)}")
    expected = HEADER_SIZE + n_seq * 4 + n_seq * 8 + n_doc * 8
    if size != expected:
        raise _corrupt(path, f"size {size} bytes, header promises {expected} "
                       f"({n_seq} sequences, {n_doc} document indices)")
    return np.dtype(DTYPE_CODES[code]), n_seq, n_doc


def read_idx(path: str | os.PathLike[str]) -> MegatronIndex:
    """Parse and validate an ``.idx`` file without reading its arrays into memory."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_SIZE:
        raise _corrupt(path, f"file is {size} bytes, shorter than the {HEADER_SIZE}-byte header")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    dtype, n_seq, n_doc = idx_header(buf[:HEADER_SIZE], size, path)
    lengths = np.frombuffer(buf, dtype=np.int32, count=n_seq, offset=HEADER_SIZE)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n_seq, offset=HEADER_SIZE + 4 * n_seq)
    docs = np.frombuffer(buf, dtype=np.int64, count=n_doc, offset=HEADER_SIZE + 12 * n_seq)
    return MegatronIndex(path, dtype, lengths, pointers, docs)


def check_index(index: MegatronIndex, bin_path: Path | str, bin_size: int | None = None
                ) -> None:
    """Structural checks tying an index to its ``.bin``: lengths, pointers, document indices,
    and ``sum(lengths) × itemsize`` equal to the ``.bin``'s size (``bin_size``, or its
    ``stat``). Vectorised in blocks of ``_CHECK_BLOCK`` sequences (memory stays flat for a
    billion-sequence index); a reader runs it when it opens a chunk's index."""
    lengths, pointers, docs = (index.sequence_lengths, index.sequence_pointers,
                               index.document_indices)
    itemsize, total = index.dtype.itemsize, 0
    for a in range(0, len(lengths), _CHECK_BLOCK):
        part = lengths[a: a + _CHECK_BLOCK].astype(np.int64)
        if (part < 0).any():
            raise _corrupt(index.path, "negative sequence length")
        starts = np.cumsum(part) - part + total  # exclusive prefix sums
        if not np.array_equal(pointers[a: a + _CHECK_BLOCK], starts * itemsize):
            raise _corrupt(index.path, "sequence pointers do not match the sequence lengths")
        total += int(part.sum())
    if len(docs) == 0 or docs[0] != 0 or docs[-1] != len(lengths):
        raise _corrupt(index.path, "document indices are not a non-decreasing 0..S sequence")
    for a in range(0, len(docs), _CHECK_BLOCK):
        if (np.diff(docs[max(a - 1, 0): a + _CHECK_BLOCK]) < 0).any():
            raise _corrupt(index.path, "document indices are not a non-decreasing 0..S "
                           "sequence")
    if bin_size is None:
        bin_size = Path(bin_path).stat().st_size
    if bin_size != total * itemsize:
        raise _corrupt(Path(bin_path), f"size {bin_size} bytes, index promises "
                       f"{total * itemsize}")


def open_bin(path: str | os.PathLike[str], dtype: npt.DTypeLike) -> npt.NDArray[np.generic]:
    """Memory-map a ``.bin`` read-only as a flat token array (empty files allowed); a size
    that is not a whole number of tokens is a :class:`CorruptChunkError` naming the file.

    A plain ndarray over an ``mmap`` (which the array keeps alive), not an ``np.memmap``:
    one open and one fstat, 11 us a map where ``np.memmap`` took 58 (it resolves the path
    and stats it again); a reader of a cache with more chunks than stay mapped maps
    several per batch. Slicing it costs no subclass overhead either."""
    dtype = np.dtype(dtype)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size % dtype.itemsize:
            raise _corrupt(Path(path), f"size {size} bytes is not a whole number of "
                           f"{dtype.name} tokens ({dtype.itemsize} bytes each)")
        if size == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=dtype)
