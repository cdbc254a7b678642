"""A remote cache's head files (manifest, ledger, its index, the ledger's journal records),
fetched once per node.

Why: every rank opening a cache on an object store used to ask the store for the same
three small objects (6 requests each with s3fs's HEAD + GET): at 1,024 ranks, 6,144
requests on three keys in one burst, which S3 answers with 503 SlowDown. Here one process
per node fetches all three at once (three ranged GETs in one round trip) into one file
of the node-local directory, and the node's other processes read that file::

    rank 0   snapshot: absent ─ lock ─ GET ×3 (one round trip) ─ publish ─▶ read
    rank 1   snapshot: absent ─ lock busy … snapshot: published ──────────▶ read
    rank 5   (a minute later)  snapshot: older than max_age ─ lock ─ GET ×3 ─▶ read

The one-builder-per-node rule is :func:`~shardwise.concurrency.build_once`'s: a fetcher
that dies releases its ``flock`` and the next waiter fetches. A snapshot serves opens for
``OPEN_FRESH_S`` seconds (the ranks of one launch), and a ledger that grows while a build
runs is re-read at most once per ``REFRESH_S`` per node, however many ranks refresh. What
a snapshot holds is checked like the objects themselves (the manifest and the index
against the ledger's checksums; the chunks against the ledger), so a snapshot can be
stale, never wrong.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

from shardwise.concurrency.once import build_once
from shardwise.errors import CacheError
from shardwise.format.atomic import atomic_write_bytes
from shardwise.format.checksum import bytes_checksum
from shardwise.format.confined import LOCK, open_under
from shardwise.format.ledger import JOURNAL_DIR, LEDGER_NAME
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.format.manifest import MANIFEST_NAME
from shardwise.remote.client import SMALL_END, RemoteStore

HEAD_NAMES = (MANIFEST_NAME, LEDGER_NAME, INDEX_NAME)
OPEN_FRESH_S = 60.0  # a snapshot opens caches for this long (one launch's ranks)
REFRESH_S = 1.0  # a growing ledger is fetched at most this often per node
SNAPSHOT_NAME = "heads"
LOCK_NAME = ".lock"


class NodeHeads:
    """The head files of the cache at ``remote``, as this node last fetched them (into
    ``directory``; one per URL)."""

    def __init__(self, remote: RemoteStore, directory: Path) -> None:
        self.remote, self.dir = remote, Path(directory)
        self.max_age = OPEN_FRESH_S
        self.fetched = 0  # snapshots fetched from the store through this object

    def read(self, name: str) -> bytes:
        """Head file ``name``'s bytes from a snapshot at most ``max_age`` seconds old
        (fetched if there is none); FileNotFoundError if the store had no such object."""
        data = self._files().get(name)
        if data is None:
            raise FileNotFoundError(self.remote.url_of(name))
        return data

    def is_head(self, name: str) -> bool:
        """True for a file the snapshot holds: the three head files and the ledger's
        journal records (:mod:`shardwise.format.journal`)."""
        return name in HEAD_NAMES or name.startswith(JOURNAL_DIR + "/")

    def _files(self) -> dict[str, bytes]:
        return build_once(self.dir / LOCK_NAME, load=self._load, build=self._fetch,
                          open_lock=lambda: open_under(self.dir, LOCK_NAME, LOCK),
                          what=f"the head files of {self.remote.url}", damaged=(CacheError,))

    def list_dir(self, directory: str) -> list[str]:
        """The journal's records the snapshot holds (the store's listing when fetched)."""
        head = directory.rstrip("/") + "/"
        return [n[len(head):] for n in self._files() if n.startswith(head)]

    def stamp(self, name: str) -> tuple[object, ...]:
        """What changes when the snapshot's copy of ``name`` does."""
        data = self._files().get(name)
        return () if data is None else (len(data), bytes_checksum(data))

    def refreshing(self) -> None:
        """From now on, serve snapshots at most ``REFRESH_S`` old (the cache is open:
        what is asked for now is whether the ledger grew)."""
        self.max_age = REFRESH_S

    def _load(self) -> dict[str, bytes] | None:
        path = self.dir / SNAPSHOT_NAME
        try:
            with open(path, "rb") as f:
                age = time.time() - os.fstat(f.fileno()).st_mtime
                raw = f.read()
        except FileNotFoundError:
            return None
        if age > self.max_age:
            return None
        return _parse(raw, path)

    def _fetch(self) -> None:
        """Under the node's lock: the journal's listing, then the three objects and the
        listed records at once, published as one file (a record the build's compaction
        deleted meanwhile is simply absent: the ledger fetched after it folds it in)."""
        records = [f"{JOURNAL_DIR}/{n}" for n in self.remote.list_dir(JOURNAL_DIR)]
        # checked: the manifest and index by the ledger's checksums, the ledger by the
        # index's record of it (or parsed whole); so the GIL-free client may fetch them
        got = self.remote.get_many([*HEAD_NAMES, *records], checked=True)
        files: dict[str, bytes] = {}
        for name, data in got.items():
            if isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, Exception):
                raise data
            # a ranged GET reads at most SMALL_END bytes: a larger ledger, whole
            files[name] = data if len(data) < SMALL_END else self.remote.get(name)
        atomic_write_bytes(self.dir / SNAPSHOT_NAME, _pack(files))
        self.fetched += 1


def _pack(files: dict[str, bytes]) -> bytes:
    """One header line (each file's name and length, in order), then the bytes."""
    header = orjson.dumps([[name, len(data)] for name, data in files.items()])
    return header + b"\n" + b"".join(files.values())


def _parse(raw: bytes, path: Path) -> dict[str, bytes]:
    head, sep, body = raw.partition(b"\n")
    try:
        entries = orjson.loads(head) if sep else None
        sizes = [(str(n), int(k)) for n, k in entries]  # type: ignore[union-attr]
    except (orjson.JSONDecodeError, TypeError, ValueError) as e:
        raise CacheError(f"{path}: not a snapshot of head files ({e})") from e
    if sum(k for _, k in sizes) != len(body):
        raise CacheError(f"{path}: {len(body)} bytes after its header, which promises "
                         f"{sum(k for _, k in sizes)}")
    files, pos = {}, 0
    for name, k in sizes:
        files[name], pos = body[pos:pos + k], pos + k
    return files


__all__ = ["HEAD_NAMES", "OPEN_FRESH_S", "REFRESH_S", "NodeHeads"]
