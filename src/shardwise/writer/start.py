"""Opening a cache for a build: the lock, the check that an existing cache is this build,
the ledger to continue, and the check of the chunks it already names.

Why its own module: everything a build does before its first task decides whether the
run is a new cache, a resume or a refusal; :func:`shardwise.writer.api.build` then only
runs tasks. The store is held for the whole build (``ChunkStore.locked``: a local
directory's lock; an object store has none, one build per URL at a time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shardwise.errors import CacheMismatchError, ConfigError
from shardwise.format.ledger import LEDGER_NAME, Ledger, SourceProgress
from shardwise.format.manifest import (
    MANIFEST_NAME,
    Manifest,
    describe_differences,
    manifest_checksum,
)
from shardwise.sources.discovery import plan_segments
from shardwise.storage.chunk_check import CheckDepth
from shardwise.storage.store import ChunkStore
from shardwise.writer.config import ChunkPolicy
from shardwise.writer.repair import Damage, find_damaged


def _prepare(store: ChunkStore, manifest: Manifest, overwrite: bool) -> Ledger | None:
    """Check an existing cache against this build; return its ledger to resume, if any."""
    if overwrite:
        store.clear()
    if not store.exists(MANIFEST_NAME):
        stray = store.entries()
        if stray:
            hint = ("; they are shardwise's own files: pass overwrite=True (--overwrite) to "
                    "remove them, or" if not store.foreign() else ";")
            raise ConfigError(f"{store.location} exists and is not a shardwise cache (it "
                              f"holds {sorted(stray)[:5]}){hint} choose an empty or new "
                              "directory or prefix")
        return None
    return _resume_ledger(store, manifest)


def _resume_ledger(root: ChunkStore, manifest: Manifest) -> Ledger | None:
    stored = Manifest.load(root)
    diffs = describe_differences(stored.identity(), manifest.identity())
    diffs = [d for d in diffs if not d.startswith("on_error")]
    if diffs:
        raise CacheMismatchError(
            f"{root.location} was built with different arguments; refusing to mix them:\n  "
            + "\n  ".join(diffs) + "\nbuild into a new directory, or pass overwrite=True "
            "(--overwrite) to start this cache again")
    return Ledger.load(root) if root.exists(LEDGER_NAME) else None


@dataclass
class Check:
    """What the check of an earlier run's chunks found (nothing checked for a new cache)."""

    depth: CheckDepth | None = None
    checked: int = 0
    seconds: float = 0.0
    damaged: list[Damage] = field(default_factory=list)


def start_ledger(root: ChunkStore, manifest: Manifest, policy: ChunkPolicy, overwrite: bool,
                 depth: CheckDepth, storage_options: dict[str, Any] | None = None
                 ) -> tuple[Ledger, Check]:
    """The ledger to continue (a new one for a new cache), and the check of the chunks it
    already names: a rerun rebuilds those that are damaged. (``storage_options``: for
    sources in a bucket, whose segments are planned here.)"""
    ledger = _prepare(root, manifest, overwrite)
    if ledger is None or Manifest.load(root).on_error != manifest.on_error:
        manifest.save(root)
    root.tidy()
    if ledger is not None:
        ledger.manifest_xxh3 = manifest_checksum(root)  # the ledger covers the manifest
        ledger.save(root)
        started = time.monotonic()
        damaged, checked = find_damaged(root, ledger, manifest, depth)
        return ledger, Check(depth, checked, time.monotonic() - started, damaged)
    ledger = Ledger([SourceProgress(plan_segments(i, policy.segment_bytes, storage_options))
                     for i in manifest.sources])
    ledger.manifest_xxh3 = manifest_checksum(root)  # the ledger covers the manifest
    ledger.save(root)
    return ledger, Check()


__all__ = ["Check", "start_ledger"]
