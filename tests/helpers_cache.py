"""Comparing caches byte for byte, and reading their documents back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import shardwise as sw
from shardwise.format.paths import READER_DIR


def cache_files(root: Path) -> dict[str, bytes]:
    """Every file of a cache (but stray temporaries, and what readers keep beside it in
    .shardwise-plans: plans, the node's verified-chunks log) by relative path, with its
    bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".tmp-")
            and READER_DIR not in p.relative_to(root).parts}


def assert_same_cache(a: Path, b: Path) -> None:
    fa, fb = cache_files(a), cache_files(b)
    assert sorted(fa) == sorted(fb), set(fa) ^ set(fb)
    differing = [name for name in fa if fa[name] != fb[name]]
    assert not differing, f"files differ: {differing[:10]}"


def cache_documents(cache: sw.Cache | Path) -> list[list[int]]:
    """Every document of a cache, in stored order, as token lists (read chunk by chunk
    through the ``.idx`` lengths)."""
    c = cache if isinstance(cache, sw.Cache) else sw.open_cache(cache)
    out: list[list[int]] = []
    for i in range(len(c.chunks)):
        tokens, lengths = c.tokens(i), c.doc_lengths(i)
        ends = np.cumsum(lengths)
        out += [tokens[e - n:e].tolist() for e, n in zip(ends, lengths, strict=True)]
    return out


def published_chunks(out: Path) -> int:
    """Chunks the ledger of a cache being built names now (-1 before it has a readable
    ledger): how a test decides when to kill a build mid-way."""
    from shardwise.errors import ManifestError
    from shardwise.format.files import LocalFiles
    from shardwise.format.ledger import Ledger

    try:  # the snapshot and the journal records after it
        ledger = Ledger.load(LocalFiles(out))
    except ManifestError:
        return -1
    return sum(len(seg.chunks) for src in ledger.sources for seg in src.segments)
