"""Which files of a cache directory shardwise wrote: what ``--overwrite`` may delete.

A cache directory holds only files shardwise writes (SPEC.md, "A cache is a directory")::

    manifest.json, ledger.json,           the build
    ledger.index
    chunks/SSSSS/GGGGG-KKKKK.{bin,idx,parquet,json}
    .shardwise-plans/…                    readers' directory: plan caches, logs (all of it)
    <16 hex>/.lock, <16 hex>/chunks/…     a remote cache's download directory, if put here
    .tmp-*, .claim-*                      interrupted writes and downloads, anywhere above

Anything else (a user's file, a symlink, an unknown directory) is *foreign*: an overwrite
refuses, naming it, before it deletes anything. Names are cache-relative, ``/``-separated.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from shardwise.errors import ConfigError
from shardwise.format.ledger import LEDGER_NAME
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.format.manifest import MANIFEST_NAME
from shardwise.remote.client import RemoteStore

PLANS_DIR = ".shardwise-plans"
_TEMP = r"(?:\.tmp-|\.claim-)[^/]*"
_CHUNK = rf"chunks/\d{{5,}}/(?:\d{{5,}}-\d{{5,}}\.(?:bin|idx|parquet|json)|{_TEMP})"
_OWNED_FILE = re.compile(
    rf"(?:{re.escape(MANIFEST_NAME)}|{re.escape(LEDGER_NAME)}|{re.escape(INDEX_NAME)}"
    rf"|{_TEMP}|{_CHUNK}"
    rf"|{re.escape(PLANS_DIR)}/.+"
    rf"|[0-9a-f]{{16}}/(?:\.lock|{_TEMP}|{_CHUNK}))")
_OWNED_DIR = re.compile(rf"(?:chunks(?:/\d{{5,}})?|{re.escape(PLANS_DIR)}(?:/.+)?"
                        rf"|[0-9a-f]{{16}}(?:/chunks(?:/\d{{5,}})?)?)")


def is_owned(name: str, *, directory: bool = False) -> bool:
    """True if shardwise writes a file (or makes a directory) of this cache-relative name."""
    return bool((_OWNED_DIR if directory else _OWNED_FILE).fullmatch(name))


def foreign_names(root: Path) -> list[str]:
    """Entries of ``root`` (recursively) shardwise did not write, sorted; symlinks are
    always foreign (shardwise never makes one, and never follows one to delete)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in dirnames + filenames:
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out.append(rel)
            elif not is_owned(rel, directory=path.is_dir()):
                out.append(rel + ("/" if path.is_dir() else ""))
        dirnames[:] = [d for d in dirnames
                       if not (here / d).is_symlink()
                       and is_owned((here / d).relative_to(root).as_posix(), directory=True)]
    return sorted(out)


def clear_cache(root: Path | RemoteStore) -> int:
    """Delete every file shardwise wrote in ``root``; returns how many. Refuses with
    :class:`ConfigError` naming the foreign entries, before deleting anything, if there
    are any. The ledger goes first (no reader then trusts a chunk about to vanish), then
    its index and the manifest, then the rest."""
    if isinstance(root, RemoteStore):
        keys = root.list_keys()
        _refuse(str(root), [k for k in keys if not is_owned(k)])
        first = [k for k in (LEDGER_NAME, INDEX_NAME, MANIFEST_NAME) if k in keys]
        root.remove(first)
        root.remove([k for k in keys if k not in first])
        return len(keys)
    if not root.is_dir():
        return 0
    _refuse(str(root), foreign_names(root))
    removed = 0
    for name in (LEDGER_NAME, INDEX_NAME, MANIFEST_NAME):
        if (root / name).exists():
            (root / name).unlink()
            removed += 1
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            removed += sum(len(files) for _, _, files in os.walk(entry))
            shutil.rmtree(entry)
        else:
            entry.unlink()
            removed += 1
    return removed


def _refuse(root: str, foreign: list[str]) -> None:
    if foreign:
        shown = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more"
                                           if len(foreign) > 10 else "")
        raise ConfigError(f"{root}: overwrite (--overwrite) deletes only what shardwise "
                          "wrote, and this "
                          f"directory also holds {len(foreign)} other entries ({shown}); "
                          "nothing was deleted: move them away, or build into another "
                          "directory")


__all__ = ["PLANS_DIR", "clear_cache", "foreign_names", "is_owned"]
