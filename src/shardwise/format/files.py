"""Where the format's files live, behind one small interface: :class:`Files`.

The format reads and writes a cache's files (manifest, ledger, its index, chunks) only
through :class:`Files`, so this layer never imports fsspec and never asks whether a cache
is local. Two implementations: :class:`LocalFiles` here (a directory, with the exact
publication protocol of :mod:`shardwise.format.atomic`: temp name, fsync, rename), which
``storage.local.LocalStore`` extends, and ``storage.bucket.BucketStore`` (a prefix on an
object store: whole objects, one PUT each). Keys named by a cache are relative and never
leave it (:func:`check_key`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Protocol

from shardwise.errors import ManifestError
from shardwise.format.atomic import atomic_write_bytes, fsync_dir, write_temp

Payload = bytes | memoryview


class Files(Protocol):
    """The few operations the format and the build need on a cache's files."""

    @property
    def location(self) -> str:
        """The directory or URL, for messages."""
        ...

    def name(self, relative: str) -> str:
        """File ``relative``'s path or URL, for messages."""
        ...

    def read(self, relative: str) -> bytes:
        """A whole (small) file; FileNotFoundError when missing."""
        ...

    def write(self, relative: str, data: Payload) -> None:
        """Replace a file atomically: temp + fsync + rename locally, one PUT on a store."""
        ...

    def publish(self, stem: str, payloads: dict[str, Payload]) -> None:
        """A chunk's files ``stem + suffix``, in the order given, each in place before the
        next starts: the last one (its metadata) only once every data file is."""
        ...

    def exists(self, relative: str) -> bool: ...

    def list(self) -> list[str]:
        """Every file under the cache, as relative keys, sorted."""
        ...

    def remove(self, relatives: list[str]) -> None: ...


def check_key(relative: str, *, where: str, root: str) -> str:
    """``relative`` as a key inside the cache ``root``; refuses absolute keys, ``..`` and
    backslashes (a cache never names objects outside its prefix)."""
    pure = PurePosixPath(relative)
    if (not relative or pure.is_absolute() or "\\" in relative or ".." in pure.parts
            or "://" in relative):
        raise ManifestError(f"{where}: key {relative!r} is not a relative key inside the "
                            f"cache {root}; a cache never names objects outside itself")
    return pure.as_posix()


class LocalFiles:
    """:class:`Files` of a local directory ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    @property
    def location(self) -> str:
        return str(self.root)

    def name(self, relative: str) -> str:
        return str(self.root / relative)

    def read(self, relative: str) -> bytes:
        return (self.root / relative).read_bytes()

    def write(self, relative: str, data: Payload) -> None:
        atomic_write_bytes(self.root / relative, data)

    def publish(self, stem: str, payloads: dict[str, Payload]) -> None:
        """Every payload to a temp name (fsynced), then renamed in order; the directory
        fsynced last."""
        base = self.root / stem
        base.parent.mkdir(parents=True, exist_ok=True)
        finals = [base.with_name(base.name + suffix) for suffix in payloads]
        temps = [write_temp(final, data) for final, data in zip(finals[:-1],
                                                                 payloads.values(),
                                                                 strict=False)]
        for tmp, final in zip(temps, finals, strict=False):
            os.replace(tmp, final)
        if finals:  # the last (the metadata) is written only once the others are in place
            os.replace(write_temp(finals[-1], list(payloads.values())[-1]), finals[-1])
        fsync_dir(base.parent)

    def exists(self, relative: str) -> bool:
        return (self.root / relative).exists()

    def list(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                      if not p.is_dir())

    def remove(self, relatives: list[str]) -> None:
        for rel in relatives:
            path = self.root / rel
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


__all__ = ["Files", "LocalFiles", "Payload", "check_key"]
