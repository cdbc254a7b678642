"""Paths stored in a cache are relative and never leave the cache directory; where
readers keep what they write beside a cache."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from shardwise.errors import ManifestError

READER_DIR = ".shardwise-plans"


def safe_join(root: Path, relative: str, *, where: str) -> Path:
    """``root / relative``, refusing absolute paths and any path that escapes ``root``
    (through ``..`` or a symlink, of a directory or of the file itself).

    ``where`` names the file that holds the path (or the file itself), for the message.
    """
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or "\\" in relative or ".." in pure.parts:
        raise ManifestError(f"{where}: path {relative!r} is not a relative path inside the "
                            f"cache {root}; a cache never names files outside itself")
    joined = (root / pure).resolve()
    base = root.resolve()
    if joined != base and base not in joined.parents:
        raise ManifestError(f"{where}: path {relative!r} resolves to {joined}, outside the "
                            f"cache {root}; a cache never reads files outside itself (copy "
                            "the file into the cache instead of linking it)")
    return root / pure


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/shardwise`` (default ``~/.cache/shardwise``)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shardwise"


def reader_dir(root: Path) -> Path:
    """Where readers keep what they write about a cache (plan caches, the node's record of
    verified chunks): ``<root>/.shardwise-plans`` when the cache directory is writable,
    else :func:`user_cache_dir` (file names there are keyed by the cache's identity)."""
    if os.access(root, os.W_OK):
        return root / READER_DIR
    return user_cache_dir()
