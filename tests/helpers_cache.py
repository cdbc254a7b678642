"""Comparing caches byte for byte."""

from __future__ import annotations

from pathlib import Path

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
