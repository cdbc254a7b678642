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

TMP_PREFIX = ".tmp-"


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


def write_temp(path: Path, data: bytes | memoryview) -> Path:
    """Write ``data`` to a fresh temporary sibling of ``path``, fsynced; return its path."""
    tmp = temp_path(path)
    with _naming(path, tmp), open(tmp, "wb") as f:
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
        with open(tmp, "wb") as f:
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


@contextmanager
def npy_blocks(path: Path, dtype: Any, length: int) -> Iterator[Callable[[Any], None]]:
    """A 1-d ``.npy`` of ``length`` values written block by block, published atomically.

    Yields ``write(block)``; on a clean exit the file must hold exactly ``length`` values,
    and is fsynced and renamed into place. Why: an array of a billion values built in
    blocks never needs to be in memory whole (a memory map would count every dirty page
    in the builder's RSS). A failure or a kill leaves only a ``.tmp-`` file::

        with npy_blocks(Path("plan.npy"), np.int64, 5) as write:
            write(np.arange(3)); write(np.arange(3, 5))
    """
    import numpy as np
    from numpy.lib import format as npy

    dt = np.dtype(dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    written = 0
    with _naming(path, tmp):
        with open(tmp, "wb") as f:
            npy.write_array_header_1_0(f, {"descr": npy.dtype_to_descr(dt),
                                           "fortran_order": False, "shape": (int(length),)})

            def write(block: Any) -> None:
                nonlocal written
                arr = np.ascontiguousarray(block, dtype=dt).reshape(-1)
                if written + arr.size > length:
                    raise ValueError(f"{path}: more than the {length} values announced")
                f.write(arr.data.cast("B"))
                written += arr.size

            yield write
            if written != length:
                raise ValueError(f"{path}: {written} values written, {length} announced")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)


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
