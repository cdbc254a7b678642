"""Paths stored in a cache are relative and never leave the cache directory."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from shardwise.errors import ManifestError


def safe_join(root: Path, relative: str, *, where: str) -> Path:
    """``root / relative``, refusing absolute paths and any path that escapes ``root``.

    ``where`` names the file that holds the path, for the error message.
    """
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or "\\" in relative or ".." in pure.parts:
        raise ManifestError(f"{where}: path {relative!r} is not a relative path inside the "
                            f"cache {root}; a cache never names files outside itself")
    joined = (root / pure).resolve()
    base = root.resolve()
    if joined != base and base not in joined.parents:
        raise ManifestError(f"{where}: path {relative!r} resolves outside the cache {root}")
    return root / pure
