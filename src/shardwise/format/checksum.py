"""Checksums of chunk files: xxh3-64, hex. Fast enough to verify terabytes."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import xxhash

ALGORITHM = "xxh3_64"
_BLOCK = 8 << 20


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
