"""Every open cache's memory maps share one process-wide budget (storage/open_maps.py):
many caches in one process must not run out of file descriptors."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.storage import open_maps


@pytest.fixture(scope="module")
def many_chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cache(tmp_path_factory.mktemp("maps") / "cache",
                      [sample_docs(240, seed=3, vocab_size=50)], chunk_docs=4, vocab_size=50)


def _chunk_fds(root: Path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(str(root)) and target.endswith((".bin", ".idx"))
    return n


def test_many_caches_hold_at_most_the_budget_of_maps(many_chunks: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(open_maps, "LIMIT", 40)
    caches = [sw.open_cache(many_chunks, verify=False) for _ in range(6)]
    assert len(caches[0].chunks) == 60
    first = {c: caches[0].tokens(c).copy() for c in range(60)}
    for cache in caches:  # 6 caches x 60 chunks x (.bin + .idx): 720 maps unbounded
        for c in range(60):
            cache.index(c)
            np.testing.assert_array_equal(cache.tokens(c), first[c])
    gc.collect()
    assert _chunk_fds(many_chunks) <= 40
    for c in range(60):  # a dropped map is mapped again, with the same tokens
        np.testing.assert_array_equal(caches[0].tokens(c), first[c])
    for cache in caches:
        cache.close()


def test_an_array_in_use_outlives_its_dropped_map(many_chunks: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(open_maps, "LIMIT", 16)
    cache = sw.open_cache(many_chunks, verify=False)
    held = cache.tokens(0)
    want = held.copy()
    for c in range(1, 60):
        cache.tokens(c)
    assert 0 not in cache.store._maps  # dropped from the cache ...
    np.testing.assert_array_equal(held, want)  # ... but the array handed out still reads
    cache.close()


def _read_all(root: Path, shuffle: str) -> tuple[sw.TokenDataset, list[list[int]]]:
    """Every example of a dataset over ``root``, one a batch (a window inside one chunk is
    gathered through its chunk's strided view; a document-shuffled one as memoryview
    pieces of the maps: both views of the store's entry for the chunk)."""
    ds = sw.TokenDataset(root, seq_len=4, shuffle=shuffle, seed=1, verify=False)
    return ds, [ds.get_batch([i])["input_ids"].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("shuffle", ["none", "document"])
def test_the_store_owns_every_view_of_its_maps(many_chunks: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               shuffle: str) -> None:
    """The views gather reads a chunk by live in the store's one entry for the chunk, so
    one budget holds them: a tiny process budget, or a small ``max_open_chunks``, drops
    them with their maps (made again when read), and every example is what an unbounded
    read gives. The reader holds no map or view of its own."""
    _, want = _read_all(many_chunks, shuffle)
    monkeypatch.setattr(open_maps, "LIMIT", 4)
    ds, got = _read_all(many_chunks, shuffle)
    assert got == want
    store = ds.cache.store
    assert 1 <= store.mapped() <= 4  # 60 chunks read: without the budget, one entry each
    assert all(open_maps.counted(store._maps, c) for c in store._maps)
    assert open_maps.count() <= 4
    gc.collect()
    assert _chunk_fds(many_chunks) <= 4
    ds.cache.close()
    monkeypatch.setattr(open_maps, "LIMIT", 1000)
    ds = sw.TokenDataset(many_chunks, seq_len=4, shuffle=shuffle, seed=1, verify=False)
    ds.cache.store.max_open_chunks = 3
    assert [ds.get_batch([i])["input_ids"].tolist() for i in range(len(ds))] == want
    assert ds.cache.store.mapped() <= 3
    gc.collect()
    assert _chunk_fds(many_chunks) <= 3 + 3  # .bin maps, and the .idx of as many
    ds.cache.close()
