"""Where a cache lives: a local directory, or a prefix on an object store (fsspec).

A local directory keeps the exact publication protocol of :mod:`shardwise.format.atomic`
(temp name, fsync, rename). An object store has no rename, so :class:`RemoteStore` writes
whole objects, each with one PUT: a chunk's data objects first, then its metadata, and
only then the ledger that names it (one PUT replacing the ledger object, which S3 makes
atomic: a reader sees the old ledger or the new one, never a mix). Readers trust only the
ledger, so an object the ledger does not name yet is invisible to them::

    s3://bucket/cache/manifest.json
    s3://bucket/cache/ledger.json                       replaced by one PUT per update
    s3://bucket/cache/chunks/00000/00000-00000.bin      PUT 1
    s3://bucket/cache/chunks/00000/00000-00000.idx      PUT 2
    s3://bucket/cache/chunks/00000/00000-00000.json     PUT 3, then the ledger names it

Credentials and endpoints come from fsspec/boto's usual environment and config
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws/…``) or from ``storage_options``
given at run time; nothing of them is ever written into the cache. Keys named by a cache
are relative and never leave its prefix (:func:`check_key`).
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

from shardwise.format.files import check_key

SMALL_END = _SMALL = 64 << 20  # a range end past the end of any small object


def is_url(path: str | os.PathLike[str] | RemoteStore) -> bool:
    """True for ``scheme://…`` (``s3://``, ``gs://``, ``memory://``…); ``file://`` and
    plain paths are local."""
    if isinstance(path, RemoteStore):
        return True
    s = os.fspath(path)
    return "://" in s and not s.startswith("file://")


class RemoteStore:
    """A cache prefix on an object store, through fsspec. Picklable, and safe across fork:
    the filesystem is re-created in each process from the URL and ``storage_options``
    (fsspec's async filesystems refuse to run in a forked child, e.g. a DataLoader
    worker)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._fs_pid = 0  # the process that made ``_fs``
        self._path = ""

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        if self._fs is None or self._fs_pid != os.getpid():
            import fsspec

            self._fs, self._path = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._path = self._path.rstrip("/")
            self._fs_pid = os.getpid()
        return self._fs

    def key(self, relative: str) -> str:
        """The filesystem path of ``relative`` (validated, never outside the prefix)."""
        rel = check_key(relative, where=self.url, root=self.url)
        _ = self.fs
        return f"{self._path}/{rel}"

    def url_of(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def put(self, relative: str, data: bytes | memoryview) -> None:
        """Write one whole object (a single PUT for small objects)."""
        self.fs.pipe_file(self.key(relative), bytes(data))

    def get(self, relative: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""
        return bytes(self.fs.cat_file(self.key(relative)))

    def read_range(self, relative: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object (fewer at its end), in one ranged GET;
        FileNotFoundError if it does not exist. (``open`` would ask for the object's
        size first: one more round trip per file on a store far away.)"""
        return bytes(self.fs.cat_file(self.key(relative), start=start, end=stop))

    def get_many(self, relatives: list[str]) -> dict[str, bytes | Exception]:
        """Small whole objects (each under 64 MiB) fetched concurrently, each in one ranged
        GET: ``relative → bytes``, or the exception that object raised
        (FileNotFoundError when it does not exist)."""
        got = self.get_ranges([(r, 0, _SMALL) for r in relatives])
        return dict(zip(relatives, got, strict=True))

    def get_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes | Exception]:
        """Bytes ``[start, stop)`` of each ``(relative, start, stop)`` (fewer at an
        object's end), all requested at once (one round trip for all on a store far
        away); in the same order, each the bytes or the exception its object raised
        (``stop = SMALL_END``: the whole of a small object)."""
        paths = [self.key(r) for r, _, _ in ranges]
        got = self.fs.cat_ranges(paths, [a for _, a, _ in ranges], [b for _, _, b in ranges],
                                 on_error="return")
        return [g if isinstance(g, Exception) else bytes(g) for g in got]

    def exists(self, relative: str) -> bool:
        return bool(self.fs.exists(self.key(relative)))

    def size(self, relative: str) -> int:
        return int(self.fs.size(self.key(relative)))

    def download(self, relative: str, dest: str | os.PathLike[str]) -> None:
        """Copy the object to the local file ``dest``, streamed (a chunk may be large);
        FileNotFoundError if it does not exist."""
        self.fs.get_file(self.key(relative), os.fspath(dest))

    def open(self, relative: str) -> BinaryIO:
        f: BinaryIO = self.fs.open(self.key(relative), "rb", block_size=8 << 20)
        return f

    def list_keys(self) -> list[str]:
        """Every object under the prefix, as relative keys, sorted."""
        _ = self.fs
        try:
            found = self.fs.find(self._path)
        except FileNotFoundError:
            return []
        head = self._path + "/"
        return sorted(p[len(head):] for p in found if p.startswith(head))

    def list_dir(self, relative: str) -> list[str]:
        """The names of the objects directly under ``relative/`` (one LIST request)."""
        try:
            found = self.fs.ls(self.key(relative), detail=True, refresh=True)
        except FileNotFoundError:
            return []
        names = (str(e["name"]).rsplit("/", 1)[-1] for e in found if e.get("type") == "file")
        return sorted(n for n in names if n)  # a store's marker of the directory itself: ''


    def stamp(self, relative: str) -> tuple[object, ...]:
        """What changes when the object is replaced: size and ETag (or time); ``()`` if it
        does not exist."""
        try:
            info = self.fs.info(self.key(relative), refresh=True)
        except FileNotFoundError:
            return ()
        return (info.get("size"), info.get("ETag") or info.get("LastModified")
                or info.get("mtime") or info.get("created"))

    def remove(self, relatives: list[str]) -> None:
        keys = [self.key(r) for r in relatives]
        if keys:
            self.fs.rm(keys)
            self.fs.invalidate_cache()
