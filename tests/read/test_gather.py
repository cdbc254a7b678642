"""``Cache.gather(runs)``: the tokens of runs ``(chunk, offset, length)`` concatenated —
the one call a reader makes per batch (storage/store.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import ConfigError, CorruptChunkError
from shardwise.storage.runs import FEW_RUNS, LONG_RUN, Runs


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cache(tmp_path_factory.mktemp("gather") / "cache",
                      [sample_docs(60, seed=5, vocab_size=500)], chunk_docs=6,
                      vocab_size=500)


def _random_runs(cache: sw.Cache, n: int, seed: int, longest: int | None = None) -> Runs:
    rng = np.random.default_rng(seed)
    tokens = cache.chunks.columns.tokens
    chunk = rng.integers(0, len(tokens), n)
    offset = rng.integers(0, tokens[chunk])
    length = rng.integers(0, tokens[chunk] - offset + 1)
    if longest is not None:
        length = np.minimum(length, longest)
    return Runs.of((chunk, offset, length))


def _expected(cache: sw.Cache, runs: Runs) -> np.ndarray:
    parts = [cache.read_tokens(int(cache.cum_tokens[c]) + a, int(cache.cum_tokens[c]) + a + k)
             for c, a, k in zip(runs.chunk, runs.offset, runs.length, strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0, cache.dtype)


@pytest.mark.parametrize(("n", "longest"), [(0, None), (1, None), (5, None),
                                            (FEW_RUNS + 1, None), (400, None),
                                            (FEW_RUNS + 1, 2), (400, 3)])
def test_gather_is_the_runs_concatenated(cache_dir: Path, n: int, longest: int | None) -> None:
    """Joined slices (few or long runs) and one fancy index per chunk (many short runs:
    fewer than LONG_RUN tokens on average) give the same tokens."""
    cache = sw.open_cache(cache_dir)
    runs = _random_runs(cache, n, seed=n, longest=longest)
    assert longest is None or runs.total < LONG_RUN * n  # the second way
    got = cache.gather(runs)
    assert got.dtype == cache.dtype
    np.testing.assert_array_equal(got, _expected(cache, runs))
    # plain arrays in a tuple are runs too
    np.testing.assert_array_equal(cache.gather(tuple(runs)), got)


@pytest.mark.parametrize(("n", "chunks"), [(1, 1), (8, 1), (8, 4), (FEW_RUNS + 7, 1),
                                           (FEW_RUNS + 7, 5)])
def test_runs_of_one_length_are_gathered_by_the_chunks_row_views(
        cache_dir: Path, n: int, chunks: int) -> None:
    """Equal runs (a batch of windows) are copied as rows of each chunk's strided view
    (one fancy index per chunk; a few in several chunks, or one run, joined): the same
    tokens, a writable array, and the store's entry for the chunk holds the view."""
    cache = sw.open_cache(cache_dir)
    rng = np.random.default_rng(n + chunks)
    k = 5
    chunk = rng.integers(0, chunks, n)
    offset = rng.integers(0, cache.chunks.columns.tokens[chunk] - k + 1)
    runs = Runs.of((chunk, offset, np.full(n, k)))
    got = cache.gather(runs)
    np.testing.assert_array_equal(got, _expected(cache, runs))
    assert got.flags.writeable and got.shape == (n * k,)
    if (chunks == 1 and n > 1) or n > FEW_RUNS:
        assert all(k in cache.store._maps.get(c)._rows for c in set(chunk.tolist()))


def test_gather_opens_only_the_chunks_it_reads(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    runs = Runs.of(([2] * 40 + [5], [1] * 40 + [0], [3] * 40 + [0]))  # chunk 5: nothing
    cache.gather(runs)
    assert set(cache.opened) == {cache.chunks[2].stem}


def test_a_run_outside_its_chunk_is_refused_by_name(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    held = int(cache.chunks.columns.tokens[1])
    with pytest.raises(ConfigError, match=rf"run 1 asks for tokens \[{held - 1}, {held + 1}\) "
                                          rf"of chunk 1;.*holds {held} tokens"):
        cache.gather(([0, 1], [0, held - 1], [1, 2]))
    with pytest.raises(ConfigError, match="run 0 asks for tokens .* of chunk 99; the cache "
                                          "has 10 chunks"):
        cache.gather(([99], [0], [1]))
    with pytest.raises(ConfigError, match="equal-length columns"):
        cache.gather(([0, 1], [0], [1]))


def test_gather_names_an_id_outside_the_vocabulary(tmp_path: Path) -> None:
    root = make_cache(tmp_path / "c", [sample_docs(20, seed=3, vocab_size=1000)],
                      chunk_docs=5, vocab_size=100)
    cache = sw.open_cache(root)
    tokens = cache.tokens(2)
    k = int(np.flatnonzero(tokens >= 100)[0])
    with pytest.raises(CorruptChunkError,
                       match=rf"{cache.chunks[2].stem}.bin: token id {int(tokens[k])} at "
                             rf"token {k} of the chunk, outside the vocabulary of 100"):
        cache.gather(([2], [k], [1]))


def test_a_document_range_gathers_its_own_runs_through_its_parent(cache_dir: Path) -> None:
    from shardwise.storage.cache_range import DocumentRange

    parent = sw.open_cache(cache_dir)
    part = DocumentRange(parent, 7, 41)  # cuts its first and last chunk
    runs = _random_runs(part, 60, seed=9)
    np.testing.assert_array_equal(part.gather(runs), _expected(part, runs))
    assert set(parent.opened) <= {parent.chunks[c].stem for c in range(len(parent.chunks))}
    with pytest.raises(ConfigError, match=r"documents \[7, 41\)"):
        part.gather(([len(part.chunks)], [0], [1]))


def test_a_document_range_raises_the_damage_its_parent_verification_found(
        tmp_path: Path) -> None:
    from shardwise.storage.cache_range import DocumentRange

    root = make_cache(tmp_path / "c", [sample_docs(30, seed=2, vocab_size=500)],
                      chunk_docs=6, vocab_size=500)
    stem = sw.open_cache(root).chunks[1].stem
    with open(root / f"{stem}.bin", "r+b") as f:  # same size, other bytes, ids in range
        f.seek(0)
        f.write(b"\x01\x00")
    parent = sw.open_cache(root)
    part = DocumentRange(parent, 3, 20)
    part.tokens(0), part.tokens(1)  # the parent opens chunks 0 and 1: verified behind
    part.wait_for_verify()
    with pytest.raises(CorruptChunkError, match=rf"{stem}.bin: .*xxh3_64"):
        part.raise_if_damaged()


def test_a_few_runs_in_several_chunks_are_checked_before_any_byte_is_returned(
        cache_dir: Path) -> None:
    """A micro-batch's runs in several chunks are checked by their lists' bounds and the
    length joined (no numpy scalar per run): a run past its chunk's end is refused by name
    even where a negative length elsewhere would make the total come out right, and so
    are a negative offset and a chunk the cache does not have."""
    cache = sw.open_cache(cache_dir)
    held = cache.chunks.columns.tokens
    end = int(held[1])
    with pytest.raises(ConfigError, match=rf"run 1 asks for tokens \[{end - 2}, {end + 3}\) "
                                          rf"of chunk 1;.*holds {end} tokens"):
        cache.gather(([0, 1, 2], [0, end - 2, 4], [4, 5, 4]))
    with pytest.raises(ConfigError, match=r"run 2 asks for tokens \[4, 1\) of chunk 2"):
        cache.gather(([0, 1, 2], [0, end - 2, 4], [4, 5, -3]))  # 4 + 2 + 0 = 9 - 3
    with pytest.raises(ConfigError, match=r"run 1 asks for tokens \[-4, 0\) of chunk 1"):
        cache.gather(([0, 1], [0, -4], [3, 4]))
    with pytest.raises(ConfigError, match=r"run 1 asks for tokens \[0, 2\) of chunk -1"):
        cache.gather(([0, -1], [0, 0], [3, 2]))


def test_equal_runs_in_one_chunk_are_checked_as_the_rows_view_reads_them(
        cache_dir: Path) -> None:
    """A micro-batch of windows in one chunk (one fancy index of its rows view) is checked
    by a negative offset or chunk on the lists and the run's end by the view itself (no
    row past the last whole run): each bad run refused by name, never wrapped around."""
    cache = sw.open_cache(cache_dir)
    end = int(cache.chunks.columns.tokens[1])
    with pytest.raises(ConfigError, match=rf"run 2 asks for tokens \[{end - 2}, {end + 2}\) "
                                          rf"of chunk 1;.*holds {end} tokens"):
        cache.gather(([1, 1, 1], [0, 3, end - 2], [4, 4, 4]))
    with pytest.raises(ConfigError, match=r"run 1 asks for tokens \[-4, 0\) of chunk 1"):
        cache.gather(([1, 1], [0, -4], [4, 4]))
    with pytest.raises(ConfigError, match=r"run 0 asks for tokens \[0, 4\) of chunk -1"):
        cache.gather(([-1, -1], [0, 3], [4, 4]))
    with pytest.raises(ConfigError, match=r"run 0 asks for tokens \[0, 4\) of chunk 10;"):
        cache.gather(([10, 10], [0, 3], [4, 4]))


def test_a_few_runs_in_several_chunks_open_only_the_chunks_they_read(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    runs = Runs.of(([3, 7, 3, 1], [5, 0, 0, 2], [4, 0, 6, 3]))  # chunk 7: nothing
    np.testing.assert_array_equal(cache.gather(runs), _expected(cache, runs))
    assert set(cache.opened) == {cache.chunks[c].stem for c in (1, 3)}


@pytest.mark.parametrize("shuffle", ["window", "none", "block"])
def test_micro_batches_of_windows_are_the_stored_stream_cut_into_windows(
        cache_dir: Path, shuffle: str) -> None:
    """Every micro-batch of a window order, read through ``gather``, against the stored
    stream read straight: windows inside one chunk, in several chunks (one length), across
    a chunk's end (two runs), and the stream's short last window (``drop_last=False``)."""
    cache = sw.open_cache(cache_dir)
    stream = cache.read_tokens(0, cache.num_tokens).astype(np.int64)
    L, m = 7, 7
    ds = sw.TokenDataset(cache, seq_len=L, shuffle=shuffle, seed=3, drop_last=False,
                         world=sw.World.single())
    assert len(ds) % m  # the last micro-batch is short too
    for lo in range(0, len(ds), m):
        idx = list(range(lo, min(lo + m, len(ds))))
        batch = ds.get_batch(idx)
        for r, w in enumerate(ds.windows(np.asarray(idx)).tolist()):
            want = stream[w * L: w * L + L + 1]
            np.testing.assert_array_equal(batch["input_ids"][r, :len(want) - 1], want[:-1])
            np.testing.assert_array_equal(batch["labels"][r, :len(want) - 1], want[1:])
