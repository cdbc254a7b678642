"""Checksums of chunk files: xxh3-64, hex. Fast enough to verify terabytes."""

from __future__ import annotations

from pathlib import Path

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
