"""A cache whose files are here: a directory, or a Megatron prefix (one ``.bin/.idx``).

Its chunk files are themselves: a chunk is memory-mapped where it lies, after checking
that its file resolves inside the cache (a symlink out is refused). Its writes keep the
directory's publication protocol (:class:`~shardwise.format.files.LocalFiles`: temp name,
fsync, rename), a build holds the directory's lock, and chunks a process opens are
checksummed in the background, once per node (:mod:`shardwise.storage.integrity`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from shardwise.concurrency import flock
from shardwise.concurrency.poll import wait_until
from shardwise.errors import CacheError, ConfigError
from shardwise.format.atomic import TMP_PREFIX, remove_stale_temps
from shardwise.format.chunk import META_SUFFIX
from shardwise.format.files import LocalFiles
from shardwise.format.ledger import LEDGER_NAME
from shardwise.format.paths import safe_join
from shardwise.storage.chunk_check import CheckDepth, ChunkExpect, check_chunk
from shardwise.storage.chunk_table import ChunkInfo
from shardwise.storage.owned import clear_directory, foreign_names
from shardwise.storage.store import ChunkStore
from shardwise.storage.verify_report import VerifyReport

_T = TypeVar("_T")

LOCK_WAIT_SECONDS = 5.0


class LocalStore(LocalFiles, ChunkStore):
    """The :class:`~shardwise.storage.store.ChunkStore` of a local directory ``root``
    (for a Megatron prefix: the directory holding it)."""

    checks_in_background = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        LocalFiles.__init__(self, root)
        ChunkStore.__init__(self)
        self._inside: set[str] = set()  # chunk files known to resolve inside the cache

    def with_file(self, info: ChunkInfo, suffix: str, use: Callable[[Path], _T]) -> _T:
        path = info.base.with_name(info.base.name + suffix)
        key = info.stem + suffix
        if not self.view.is_megatron and key not in self._inside:
            safe_join(self.root, key, where=str(path))  # a symlink out is refused
            self._inside.add(key)
        return use(path)

    def _meta_bytes(self, info: ChunkInfo) -> bytes | Exception:
        try:
            return self.with_file(info, META_SUFFIX, Path.read_bytes)
        except FileNotFoundError as e:
            return e

    def bin_size(self, info: ChunkInfo) -> int:
        return os.stat(info.base.with_name(info.base.name + ".bin")).st_size

    # -- a build -------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive advisory lock on the directory (made if missing) for the
        ``with`` block. The kernel releases it when the process dies, so a crash leaves
        no lock behind; waits a few seconds for a build that is just dying."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise ConfigError(f"{root}: exists and is not a directory; a cache is a "
                              "directory: choose a new or empty directory, or an existing "
                              "cache")
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY)
        flock.hold(fd)  # a forked worker must not keep the lock alive after the build dies
        try:
            wait_until(lambda: flock.try_lock(fd), timeout=LOCK_WAIT_SECONDS,
                       poll_interval=0.05, what=f"the lock of {root}",
                       on_timeout=lambda waited: CacheError(
                           f"{root}: another build is writing this cache right now"))
            yield
        finally:
            flock.release(fd)

    def tidy(self) -> None:
        remove_stale_temps(self.root)

    def clear(self) -> int:
        """Delete what shardwise wrote here (:func:`~shardwise.storage.owned.clear_directory`)."""
        return clear_directory(self.root)

    def entries(self) -> list[str]:
        """What the directory holds, interrupted writes aside."""
        if not self.root.is_dir():
            return []
        return [p.name for p in self.root.iterdir() if not p.name.startswith(TMP_PREFIX)]

    def foreign(self) -> list[str]:
        return foreign_names(self.root)

    def check_published(self, exp: ChunkExpect, depth: CheckDepth) -> VerifyReport:
        """A published chunk against what the ledger expects of it."""
        safe_join(self.root, exp.entry.stem, where=self.name(LEDGER_NAME))
        return check_chunk(replace(exp, root=self.root), depth=depth)


__all__ = ["LocalStore"]
