"""Where the format's files live: a local directory or an object store, behind one small
interface, so this layer never imports fsspec.

A local directory keeps the exact publication protocol of :mod:`shardwise.format.atomic`
(temp name, fsync, rename). Anything else is an :class:`ObjectStore` (implemented by
:class:`shardwise.remote.client.RemoteStore`): whole objects, one PUT each. Keys named by a
cache are relative and never leave it (:func:`check_key`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol, runtime_checkable

from shardwise.errors import ManifestError
from shardwise.format.atomic import atomic_write_bytes


@runtime_checkable
class ObjectStore(Protocol):
    """The few operations the format needs from an object store (see RemoteStore)."""

    url: str

    def url_of(self, relative: str) -> str: ...
    def put(self, relative: str, data: bytes | memoryview) -> None: ...
    def get(self, relative: str) -> bytes: ...
    def exists(self, relative: str) -> bool: ...
    def open(self, relative: str) -> BinaryIO: ...


Root = Path | ObjectStore


def check_key(relative: str, *, where: str, root: str) -> str:
    """``relative`` as a key inside the cache ``root``; refuses absolute keys, ``..`` and
    backslashes (a cache never names objects outside its prefix)."""
    pure = PurePosixPath(relative)
    if (not relative or pure.is_absolute() or "\\" in relative or ".." in pure.parts
            or "://" in relative):
        raise ManifestError(f"{where}: key {relative!r} is not a relative key inside the "
                            f"cache {root}; a cache never names objects outside itself")
    return pure.as_posix()


def where(root: Root, name: str) -> str:
    """How to name file ``name`` of ``root`` in a message: its path or its URL."""
    return root.url_of(name) if not isinstance(root, Path) else str(root / name)


def read_file(root: Root, name: str) -> bytes:
    """A cache file's bytes (FileNotFoundError if missing)."""
    if not isinstance(root, Path):
        return root.get(name)
    return (root / name).read_bytes()


def write_file(root: Root, name: str, data: bytes | memoryview) -> None:
    """Replace a cache file atomically: rename locally, one PUT on an object store."""
    if not isinstance(root, Path):
        root.put(name, data)
    else:
        atomic_write_bytes(root / name, data)
