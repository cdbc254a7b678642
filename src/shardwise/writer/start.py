"""Opening a cache for a build: the lock, the check that an existing cache is this build,
the ledger to continue, and the check of the chunks it already names.

Why its own module: everything a build does before its first task decides whether the
run is a new cache, a resume or a refusal; :func:`shardwise.writer.api.build` then only
runs tasks. A local directory is locked for the whole build; an object store has no lock
(one build per URL at a time).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shardwise.concurrency import flock
from shardwise.concurrency.poll import wait_until
from shardwise.errors import CacheError, CacheMismatchError, ConfigError
from shardwise.format.atomic import remove_stale_temps
from shardwise.format.files import Root
from shardwise.format.ledger import LEDGER_NAME, Ledger, SourceProgress
from shardwise.format.manifest import (
    MANIFEST_NAME,
    Manifest,
    describe_differences,
    manifest_checksum,
)
from shardwise.remote.client import RemoteStore
from shardwise.sources.discovery import plan_segments
from shardwise.storage.chunk_check import CheckDepth
from shardwise.storage.owned import clear_cache, foreign_names
from shardwise.writer.config import ChunkPolicy
from shardwise.writer.repair import Damage, find_damaged

LOCK_WAIT_SECONDS = 5.0


@contextmanager
def locked(root: Root) -> Iterator[None]:
    """Hold an exclusive advisory lock on a local cache directory (made if missing) for
    the ``with`` block; an object store has no lock. The kernel releases the lock when
    the process dies, so a crash leaves no lock file behind. Waits a few seconds for a
    build that is just dying (its lock goes with its last process)."""
    if not isinstance(root, Path):
        yield
        return
    make_dir(root)
    fd = os.open(root, os.O_RDONLY)
    flock.hold(fd)  # a forked worker must not keep the lock alive after the build dies
    try:
        wait_until(lambda: flock.try_lock(fd), timeout=LOCK_WAIT_SECONDS, poll_interval=0.05,
                   what=f"the lock of {root}", on_timeout=lambda waited: CacheError(
                       f"{root}: another build is writing this cache right now"))
        yield
    finally:
        flock.release(fd)


def _prepare_root(root: Path, manifest: Manifest, overwrite: bool) -> Ledger | None:
    """Check an existing cache against this build; return its ledger to resume, if any."""
    if overwrite:
        clear_cache(root)
    if not (root / MANIFEST_NAME).exists():
        stray = [p.name for p in root.iterdir() if not p.name.startswith(".tmp-")]
        if stray:
            hint = ("; they are shardwise's own files: pass overwrite=True (--overwrite) to "
                    "remove them, or" if not foreign_names(root) else ";")
            raise ConfigError(f"{root} exists and is not a shardwise cache (it holds "
                              f"{sorted(stray)[:5]}){hint} choose an empty or new directory")
        return None
    return _resume_ledger(root, manifest)


def _prepare_remote(store: RemoteStore, manifest: Manifest, overwrite: bool) -> Ledger | None:
    """:func:`_prepare_root` for a cache on an object store (no lock: see
    :func:`~shardwise.writer.api.build`)."""
    if overwrite:
        clear_cache(store)
    keys = store.list_keys()
    if MANIFEST_NAME not in keys:
        if keys:
            raise ConfigError(f"{store} exists and is not a shardwise cache (it holds "
                              f"{keys[:5]}); choose an empty or new prefix")
        return None
    return _resume_ledger(store, manifest)


def _resume_ledger(root: Root, manifest: Manifest) -> Ledger | None:
    stored = Manifest.load(root)
    diffs = describe_differences(stored.identity(), manifest.identity())
    diffs = [d for d in diffs if not d.startswith("on_error")]
    if diffs:
        raise CacheMismatchError(
            f"{root} was built with different arguments; refusing to mix them:\n  "
            + "\n  ".join(diffs) + "\nbuild into a new directory, or pass overwrite=True "
            "(--overwrite) to start this cache again")
    has_ledger = ((root / LEDGER_NAME).exists() if isinstance(root, Path)
                  else root.exists(LEDGER_NAME))
    return Ledger.load(root) if has_ledger else None


def make_dir(root: Path) -> None:
    """The cache directory, made if missing; a file in its place is a usage error."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: exists and is not a directory; a cache is a directory: "
                          "choose a new or empty directory, or an existing cache")
    root.mkdir(parents=True, exist_ok=True)


@dataclass
class Check:
    """What the check of an earlier run's chunks found (nothing checked for a new cache)."""

    depth: CheckDepth | None = None
    checked: int = 0
    seconds: float = 0.0
    damaged: list[Damage] = field(default_factory=list)


def start_ledger(root: Path | RemoteStore, manifest: Manifest, policy: ChunkPolicy, overwrite: bool,
           depth: CheckDepth) -> tuple[Ledger, Check]:
    """The ledger to continue (a new one for a new cache), and the check of the chunks it
    already names: a rerun rebuilds those that are damaged."""
    ledger = (_prepare_remote(root, manifest, overwrite) if isinstance(root, RemoteStore)
              else _prepare_root(root, manifest, overwrite))
    if ledger is None or Manifest.load(root).on_error != manifest.on_error:
        manifest.save(root)
    if isinstance(root, Path):
        remove_stale_temps(root)
    if ledger is not None:
        ledger.manifest_xxh3 = manifest_checksum(root)  # the ledger covers the manifest
        ledger.save(root)
        started = time.monotonic()
        damaged, checked = find_damaged(root, ledger, manifest, depth)
        return ledger, Check(depth, checked, time.monotonic() - started, damaged)
    ledger = Ledger([SourceProgress(plan_segments(i, policy.segment_bytes))
                     for i in manifest.sources])
    ledger.manifest_xxh3 = manifest_checksum(root)  # the ledger covers the manifest
    ledger.save(root)
    return ledger, Check()


__all__ = ["LOCK_WAIT_SECONDS", "Check", "locked", "make_dir", "start_ledger"]
