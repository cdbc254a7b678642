"""Checksums of chunk files: xxh3-64, hex. Fast enough to verify terabytes.

A ``.bin`` also carries the xxh3-64 of each of its :data:`BLOCK_BYTES` blocks
(:func:`block_checksums`), so a read of a few of its bytes by a ranged GET is checked
before it is used, without the rest of the file (format/SPEC.md, "Chunk metadata")."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import xxhash

ALGORITHM = "xxh3_64"
_BLOCK = 8 << 20
BLOCK_BYTES = 64 << 10  # a .bin's checked unit for ranged reads: 1,024 sums per 64 MiB


def bytes_checksum(data: bytes | memoryview) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def file_checksum(path: Path) -> str:
    """Checksum of a whole file, read in 8 MiB blocks (constant memory)."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def copy_checksum(path: Path, out: BinaryIO) -> tuple[int, str]:
    """Append the file ``path`` to ``out`` and return (bytes copied, its checksum): one
    read of each 8 MiB block serves both, so a copy is verified at the cost of a copy."""
    h, n = xxhash.xxh3_64(), 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            out.write(block)
            n += len(block)
    return n, h.hexdigest()


def block_checksums(data: bytes | memoryview, block: int = BLOCK_BYTES) -> str:
    """The xxh3-64 of each ``block``-byte block of ``data`` (the last one shorter), as
    little-endian unsigned 64-bit integers, base64: 11 KiB of text per 64 MiB."""
    return _encode(_block_ints(memoryview(data).cast("B"), block))


def file_checksums(path: Path, block: int) -> tuple[str, str]:
    """A file's :func:`file_checksum` and its :func:`block_checksums`, in one read of it
    (in pieces of whole blocks, about 8 MiB: constant memory)."""
    h, sums, piece = xxhash.xxh3_64(), [], block * max(1, _BLOCK // block)
    with open(path, "rb") as f:
        while data := f.read(piece):
            h.update(data)
            sums += _block_ints(memoryview(data), block)
    return h.hexdigest(), _encode(sums)


def _block_ints(view: memoryview, block: int) -> list[int]:
    return [xxhash.xxh3_64_intdigest(view[a:a + block]) for a in range(0, len(view), block)]


def _encode(sums: list[int]) -> str:
    return base64.b64encode(np.asarray(sums, dtype="<u8").tobytes()).decode("ascii")


def decode_block_checksums(text: str) -> npt.NDArray[np.uint64]:
    """:func:`block_checksums`'s text back as the sums; ValueError if it is not one."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 8:
        raise ValueError(f"block checksums of {len(raw)} bytes, not a multiple of 8")
    return np.frombuffer(raw, dtype="<u8")


def first_bad_block(data: bytes | memoryview, first: int, sums: npt.NDArray[np.uint64],
                    block: int = BLOCK_BYTES) -> int:
    """The number of the first block of ``data`` (which starts at block ``first`` and
    holds whole blocks, the file's last one possibly short) whose xxh3-64 is not its sum
    in ``sums``; -1 if every one matches."""
    view = memoryview(data).cast("B")
    for k, a in enumerate(range(0, len(view), block)):
        if xxhash.xxh3_64_intdigest(view[a:a + block]) != int(sums[first + k]):
            return first + k
    return -1
