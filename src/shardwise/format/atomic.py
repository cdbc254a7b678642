"""Atomic publication: a file is visible under its final name only when complete.

Write to a temporary name in the same directory, fsync, rename, fsync the directory.
A process killed at any instant leaves either the old file or the new one, plus at
most a temporary file whose name starts with ``.tmp-`` (ignored by readers, removed
by the next build).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from shardwise.format.confined import open_under

TMP_PREFIX = ".tmp-"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def temp_path(path: Path) -> Path:
    """A unique temporary sibling of ``path`` (same directory, so rename is atomic)."""
    return path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{os.urandom(4).hex()}")


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _naming(path: Path, tmp: Path) -> Iterator[None]:
    """Remove ``tmp`` if writing fails (a full disk gets its space back), and name
    ``path`` in an OSError that names no file (``write``/``fsync`` errors such as ENOSPC
    or EFBIG carry none), so the user learns where it happened."""
    try:
        yield
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)
        raise


def open_temp(tmp: Path) -> BinaryIO:
    """The fresh temporary file ``tmp`` (:func:`temp_path`), created exclusively through
    :func:`~shardwise.format.confined.open_under`: never a symlink followed."""
    return os.fdopen(open_under(tmp.parent, tmp.name, _CREATE), "wb")


def write_temp(path: Path, data: bytes | memoryview) -> Path:
    """Write ``data`` to a fresh temporary sibling of ``path``, fsynced; return its path."""
    tmp = temp_path(path)
    with _naming(path, tmp), open_temp(tmp) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_with(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Like :func:`atomic_write_bytes`, with ``write(file)`` producing the content
    (e.g. ``np.save``) so large data is not copied into one bytes object first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    with _naming(path, tmp):
        with open_temp(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)


def save_npy(path: Path, array: Any) -> None:
    """An ``.npy`` file published atomically (never pickled)."""
    import numpy as np

    data = np.asarray(array)
    atomic_write_with(path, lambda f: np.save(f, data, allow_pickle=False))


class _Hashed:
    """A file that hashes what is written to it: the checksum a reader checks it by."""

    def __init__(self, f: BinaryIO) -> None:
        import xxhash

        self.f, self._h = f, xxhash.xxh3_64()

    def write(self, data: Any) -> None:
        self._h.update(data)
        self.f.write(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class NpyBlocks:
    """What :func:`npy_blocks` yields: ``put(block)`` appends values; once published,
    ``xxh3`` is the xxh3-64 of the file's bytes (header included), to record beside it."""

    def __init__(self, out: _Hashed, path: Path, dtype: Any, length: int) -> None:
        self._out, self._path, self._dt, self.length = out, path, dtype, length
        self.written, self.xxh3 = 0, ""

    def __call__(self, block: Any) -> None:
        import numpy as np

        arr = np.ascontiguousarray(block, dtype=self._dt).reshape(-1)
        if self.written + arr.size > self.length:
            raise ValueError(f"{self._path}: more than the {self.length} values announced")
        self._out.write(arr.data.cast("B"))
        self.written += arr.size


@contextmanager
def npy_blocks(path: Path, dtype: Any, length: int) -> Iterator[NpyBlocks]:
    """A 1-d ``.npy`` of ``length`` values written block by block, published atomically.

    Yields ``put(block)`` (:class:`NpyBlocks`); on a clean exit the file must hold exactly
    ``length`` values, and is fsynced and renamed into place, ``put.xxh3`` its checksum.
    Why: an array of a billion values built in blocks never needs to be in memory whole
    (a memory map would count every dirty page in the builder's RSS). A failure or a kill
    leaves only a ``.tmp-`` file::

        with npy_blocks(Path("plan.npy"), np.int64, 5) as put:
            put(np.arange(3)); put(np.arange(3, 5))
        put.xxh3                     # '5a1f…': recorded in the plan's metadata
    """
    import numpy as np
    from numpy.lib import format as npy

    dt = np.dtype(dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    with _naming(path, tmp):
        with open_temp(tmp) as f:
            out = _Hashed(f)
            npy.write_array_header_1_0(out, {"descr": npy.dtype_to_descr(dt),
                                             "fortran_order": False, "shape": (int(length),)})
            put = NpyBlocks(out, path, dt, int(length))
            yield put
            if put.written != length:
                raise ValueError(f"{path}: {put.written} values written, {length} announced")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)
    put.xxh3 = out.hexdigest()


def remove_stale_temps(directory: Path) -> int:
    """Delete temporary files a killed writer left in ``directory`` (recursively)."""
    removed = 0
    if not directory.exists():
        return 0
    for p in directory.rglob(f"{TMP_PREFIX}*"):
        try:
            p.unlink()
            removed += 1
        except OSError:
            pass
    return removed
