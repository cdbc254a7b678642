"""Checksums of chunk files: xxh3-64, hex. Fast enough to verify terabytes.

A ``.bin`` also carries the xxh3-64 of each of its :data:`BLOCK_BYTES` blocks
(:func:`block_checksums`), so a read of a few of its bytes by a ranged GET is checked
before it is used, without the rest of the file (format/SPEC.md, "Chunk metadata")."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from shardwise.format.confined import open_regular

ALGORITHM = "xxh3_64"
_BLOCK = 8 << 20
BLOCK_BYTES = 64 << 10  # a .bin's checked unit for ranged reads: 1,024 sums per 64 MiB


def bytes_checksum(data: bytes | memoryview) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def file_checksum(path: Path) -> str:
    """Checksum of a whole file, read in 8 MiB blocks (constant memory)."""
    with open(path, "rb") as f:
        return stream_checksum(f)


def stream_checksum(f: BinaryIO) -> str:
    """Checksum of what is left of the open file ``f``, read in 8 MiB blocks."""
    h = xxhash.xxh3_64()
    while block := f.read(_BLOCK):
        h.update(block)
    return h.hexdigest()


class KnownFiles(Protocol):
    """Files this node has checked, by a line naming the file's identity
    (:class:`~shardwise.storage.verifier.VerifiedLog`)."""

    def __contains__(self, key: str) -> bool: ...
    def add(self, key: str) -> None: ...


def map_checked_npy(path: Path, xxh3: str, fix: str, known: KnownFiles | None = None
                    ) -> npt.NDArray[Any]:
    """The ``.npy`` file ``path`` memory-mapped, once its bytes are found to match
    ``xxh3`` (their checksum when it was published); ValueError naming it, with ``fix``,
    if they do not or it cannot be read. Hashed by plain reads, so the map's pages stay
    out of the reader's RSS; the map is of the very file hashed (one descriptor), even if
    the name is replaced meanwhile. ``known``: the node's record of checked files: a file
    it lists with this identity (checksum, size, mtime, device, inode) is not hashed
    again, one that passes is added (a 1.2 GB plan is hashed once per node, not per
    process)."""
    try:
        with open_regular(path) as f:  # a FIFO planted as a plan: a CacheError, no hang
            st = os.fstat(f.fileno())
            key = (f"{path.name} {xxh3} {st.st_size} {st.st_mtime_ns} {st.st_dev} "
                   f"{st.st_ino} plan")
            if known is not None and key in known:
                return _map_npy(f)
            got = stream_checksum(f)
            if got == xxh3:
                if known is not None:
                    known.add(key)
                f.seek(0)
                return _map_npy(f)
    except (OSError, ValueError) as exc:  # missing, a bad header, shorter than it says
        raise ValueError(f"{path}: cannot be read as .npy ({exc}); {fix}") from exc
    raise ValueError(f"{path}: xxh3_64 {got}, published as {xxh3} (damaged or edited "
                     f"since); {fix}")


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


def _map_npy(f: BinaryIO) -> npt.NDArray[Any]:
    """The ``.npy`` open as ``f`` memory-mapped read-only (``np.load`` maps only a name)."""
    from numpy.lib import format as npy

    major, _ = npy.read_magic(f)
    read = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
    shape, fortran, dtype = read(f)
    if dtype.hasobject:
        raise ValueError(f"dtype {dtype} holds Python objects")
    return np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape,
                     order="F" if fortran else "C")


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
