"""Source files in a bucket (``s3://``, ``gs://``, ``az://``, anything fsspec speaks),
read through the one object-store client (:class:`~shardwise.remote.RemoteStore`), so its
timeouts and retries apply to every request a build makes of its sources.

An object opens as a seekable binary file whose every read is **one ranged GET** of just
the bytes asked for (:class:`RangedFile`), behind a read buffer: a JSONL segment is read
in the reader's 4 MiB blocks from its own offset, a compressed file streamed front to
back in blocks, a Parquet file's footer and then each row group's column chunks (pyarrow
over the Python file). Nothing is downloaded whole::

    s3://b/raw/a.jsonl   segment [8 MiB, 12 MiB): GET bytes=8388607-12582911, then lines
    s3://b/raw/c.parquet footer: GET the last 64 KiB; row group 3: GET its column chunks

Globs and directories expand as locally (a directory: every source file under it,
sorted; ``*`` does not cross ``/``, ``**`` does), from one listing of the prefix before
the first wildcard. Where the bucket's credentials come from: the environment (fsspec's
usual ``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) or the build's ``storage_options``; they are
never written anywhere.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, BinaryIO

from shardwise.concurrency.threads import ThreadPool
from shardwise.errors import ConfigError, InputError
from shardwise.remote.client import RemoteStore, is_url

Options = dict[str, Any] | None
READ_BUFFER = 4 << 20  # one GET per 4 MiB read sequentially
_WILDCARDS = re.compile(r"[*?\[]")

__all__ = ["RangedFile", "expand_url", "line_probes", "object_exists", "object_size",
           "open_source", "parquet_input", "read_samples"]


def _locate(url: str, options: Options) -> tuple[RemoteStore, str]:
    """The client for the object's "directory" and the object's key in it."""
    head, _, name = url.rstrip("/").rpartition("/")
    if "://" not in head or not name:
        raise ConfigError(f"{url}: not an object URL; expected scheme://bucket/path/file")
    return RemoteStore(head, options), name


class RangedFile(io.RawIOBase):
    """An object of known ``size`` as a raw, seekable file: each ``readinto`` is one
    ranged GET through the client.

    Read ahead (``ahead_until``): after a read of ``n`` bytes at ``p``, the next ``n``
    bytes (below ``ahead_until``) are fetched on a background thread, so a sequential
    reader (a segment's lines, a compressed stream) tokenizes one block while the next
    one travels; a read elsewhere drops it."""

    def __init__(self, store: RemoteStore, key: str, size: int,
                 ahead_until: int | None = None) -> None:
        super().__init__()
        self.store, self.key, self.size, self.pos = store, key, size, 0
        self.name = store.url_of(key)
        self.ahead_until = min(size, ahead_until) if ahead_until is not None else 0
        self._pool: ThreadPool | None = None
        self._ahead: tuple[int, Future[bytes]] | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        data = self._take(self.pos, n)
        buffer[:len(data)] = data
        self.pos += len(data)
        start = self.pos
        if start < self.ahead_until:
            if self._pool is None:
                self._pool = ThreadPool(1, name="shardwise-source")
            stop = min(start + len(buffer), self.ahead_until)
            self._ahead = (start, self._pool.submit(
                lambda: self.store.read_range(self.key, start, stop)))
        return len(data)

    def _take(self, start: int, n: int) -> bytes:
        """Bytes ``[start, start + n)``: from the read ahead when it began there."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == start:
            data = ahead[1].result()
            if len(data) >= n or start + len(data) >= self.size:
                return data[:n]
        elif ahead is not None:
            ahead[1].cancel()
        return self.store.read_range(self.key, start, start + n)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close(wait=False)
            self._pool = None
        super().close()


def open_source(path: str, options: Options = None, *, buffer: int = READ_BUFFER,
                size: int | None = None, ahead_until: int | None = None) -> BinaryIO:
    """A local file opened for reading, or an object as a buffered :class:`RangedFile`
    (``buffer``: bytes per GET when read in small pieces; larger reads go in one GET;
    ``size``: the object's, when known, saves a HEAD; ``ahead_until``: read ahead below
    this offset, for a reader that goes front to back)."""
    if not is_url(path):
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    store, key = _locate(path, options)
    raw = RangedFile(store, key, store.size(key) if size is None else size, ahead_until)
    return io.BufferedReader(raw, buffer_size=buffer)  # type: ignore[return-value]


@contextmanager
def parquet_input(path: str, options: Options = None, size: int | None = None
                  ) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetFile`` of a local file, or of an object read by ranged
    GETs (its footer, then the column chunks a reader asks for)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if not is_url(path):
            pf = pq.ParquetFile(path)
        else:
            f = open_source(path, options, buffer=64 << 10, size=size)
            pf = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        # a whole file that is not Parquet has no records to skip and count: refused under
        # on_error='skip' too, so a source never disappears from a cache unannounced
        raise InputError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e}); "
                         "replace it, or leave it out of the sources", path=path,
                         reason="unreadable_file") from e
    try:
        yield pf
    finally:
        if is_url(path):
            f.close()


def object_size(path: str, options: Options = None) -> int:
    """A source's size in bytes (one HEAD for an object)."""
    if not is_url(path):
        return os.path.getsize(path)
    store, key = _locate(path, options)
    return store.size(key)


def read_samples(path: str, ranges: Sequence[tuple[int, int]], options: Options = None
                 ) -> list[bytes]:
    """Bytes ``[start, stop)`` of each range (an object's all requested at once)."""
    if not is_url(path):
        out = []
        with open(path, "rb") as f:
            for start, stop in ranges:
                f.seek(start)
                out.append(f.read(stop - start))
        return out
    store, key = _locate(path, options)
    got = store.get_ranges([(key, a, b) for a, b in ranges])
    for g in got:
        if isinstance(g, Exception):
            raise g
    return got  # type: ignore[return-value]


def line_probes(path: str, positions: Sequence[int], options: Options = None,
                probe: int = 64 << 10) -> dict[int, int]:
    """For an object: the first line start at or after each position whose next newline
    lies within ``probe`` bytes, all fetched at once (segment bounds cost one round trip,
    not one per segment). Empty for a local file (seeking there is free)."""
    if not is_url(path) or not positions:
        return {}
    store, key = _locate(path, options)
    got = store.get_ranges([(key, p - 1, p - 1 + probe) for p in positions])
    out = {}
    for p, data in zip(positions, got, strict=True):
        if isinstance(data, Exception):
            raise data
        nl = data.find(b"\n")
        if nl >= 0:
            out[p] = p + nl
    return out


def object_exists(url: str, options: Options = None) -> bool:
    store, key = _locate(url, options)
    return store.exists(key)


def expand_url(pattern: str, options: Options = None) -> list[str]:
    """The object URLs a URL names: itself, every object under it (a directory), or
    the objects its wildcards match; sorted for a directory or a glob; [] when none.
    (A name with a source's suffix is better checked with :func:`object_exists`: one
    HEAD, where listing under a file's name can be slow on some stores.)"""
    wild = _WILDCARDS.search(pattern)
    if wild is None:
        store = RemoteStore(pattern.rstrip("/"), options)
        under = store.list_keys()
        if under:
            return [store.url_of(k) for k in under]
        if pattern.endswith("/"):
            return []
        where, key = _locate(pattern, options)
        return [pattern] if where.exists(key) else []
    root = pattern[:wild.start()].rpartition("/")[0]
    if "://" not in root:
        raise ConfigError(f"{pattern}: a wildcard in the bucket name; put wildcards in the "
                          "object path only (s3://bucket/raw/*.jsonl)")
    from fsspec.utils import glob_translate

    match = re.compile(glob_translate(pattern[len(root) + 1:])).match
    store = RemoteStore(root, options)
    return [store.url_of(k) for k in store.list_keys() if match(k)]
