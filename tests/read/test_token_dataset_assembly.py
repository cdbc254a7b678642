"""TokenDataset.get_batch (what __getitems__ wraps) against a reference built from the plan
and the raw stream.

The batched read path has several routes (every window inside one chunk: one gather; rows
one by one; a window across a chunk edge; the short last window; padding; indices in
several order blocks or epochs). Whatever the route, a row must be the window the plan
names, sliced from the concatenated stream.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardwise as sw
from shardwise.read.orders.windows import ORDER_BLOCK

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache, sample_docs  # noqa: E402

SEQ = 4  # short windows: many cross a chunk edge, and > 2 order blocks per epoch


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sources, chunks of ~7 documents (~280 tokens): windows cross chunk edges."""
    root = tmp_path_factory.mktemp("assembly") / "cache"
    return make_cache(root, [sample_docs(600, seed=1), sample_docs(500, seed=2)],
                      chunk_docs=7)


@pytest.fixture(scope="module")
def one_file(chunked: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same stream as one Megatron .bin/.idx (one chunk: the single-gather route)."""
    from shardwise.writer.convert import to_megatron

    prefix = tmp_path_factory.mktemp("assembly-megatron") / "corpus_text_document"
    to_megatron(chunked, prefix)
    return prefix


def _stream(cache: sw.Cache) -> np.ndarray:
    return np.concatenate([cache.tokens(i) for i in range(len(cache.chunks))]).astype(np.int64)


def _reference(ds: sw.TokenDataset, stream: np.ndarray, idx: list[int]) -> dict[str, np.ndarray]:
    L = ds.config.seq_len
    rows = np.zeros((len(idx), L + 1), dtype=np.int64)
    mask = np.zeros((len(idx), L), dtype=np.float32)
    for r, i in enumerate(idx):
        if i == sw.PAD:
            continue
        w = int(ds.windows([i])[0])
        window = stream[w * L: w * L + L + 1]
        rows[r, : len(window)] = window
        mask[r, : len(window) - 1] = 1.0
    labels = np.where(mask == 1, rows[:, 1:], -100)  # next-token, -100 without loss
    return {"input_ids": rows[:, :L], "labels": labels, "loss_mask": mask,
            "position_ids": np.tile(np.arange(L, dtype=np.int64), (len(idx), 1))}


def _assert_matches(ds: sw.TokenDataset, stream: np.ndarray, idx: list[int]) -> None:
    got, want = ds.get_batch(idx), _reference(ds, stream, idx)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k} for indices {idx}")


# indices drawn near order-block edges, across epochs, with padding rows mixed in
_index = st.one_of(st.integers(0, 4 * ORDER_BLOCK),
                   st.integers(-3, 3).map(lambda d: ORDER_BLOCK + d),
                   st.just(sw.PAD))


@pytest.mark.parametrize("shuffle", ["none", "window", "block"])
@pytest.mark.parametrize("drop_last", [True, False])
@settings(max_examples=40, deadline=None)
@given(idx=st.lists(_index, max_size=12))
def test_any_indices_give_the_planned_windows(chunked: Path, shuffle: str, drop_last: bool,
                                             idx: list[int]) -> None:
    ds = sw.TokenDataset(chunked, seq_len=SEQ, seed=11, shuffle=shuffle, drop_last=drop_last)
    assert len(ds) > 2 * ORDER_BLOCK
    _assert_matches(ds, _stream(ds.cache), idx)


@pytest.mark.parametrize("source", ["chunked", "one_file"])
def test_sampler_micro_batches_give_the_planned_windows(source: str,
                                                        request: pytest.FixtureRequest
                                                        ) -> None:
    """Consecutive micro-batches (what a sampler asks for) through the last block of one
    epoch into the next, and the last (short) window, read on every route."""
    ds = sw.TokenDataset(request.getfixturevalue(source), seq_len=SEQ, seed=3,
                         drop_last=False)
    stream, n, m = _stream(ds.cache), len(ds), 8
    for start in [0, ORDER_BLOCK - 4, n - 2 * m, n - 3, 5 * n + 17]:
        for k in range(3):
            _assert_matches(ds, stream, list(range(start + k * m, start + (k + 1) * m)))
    no_shuffle = sw.TokenDataset(ds.cache, seq_len=SEQ, shuffle="none", drop_last=False)
    _assert_matches(no_shuffle, stream, [n - 1, 0, n - 1])  # the short window, padded


def test_empty_micro_batch_has_every_field(chunked: Path, tmp_path: Path) -> None:
    for shuffle in ["none", "window", "document"]:
        ds = sw.TokenDataset(chunked, seq_len=SEQ, shuffle=shuffle, cu_seqlens=True,
                             plan_dir=tmp_path)
        batch = ds.get_batch([])
        assert {k: v.shape for k, v in batch.items()} == {
            "input_ids": (0, SEQ), "labels": (0, SEQ), "loss_mask": (0, SEQ),
            "position_ids": (0, SEQ), "cu_seqlens": (1,), "max_seqlen": ()}, shuffle
        assert batch["cu_seqlens"].tolist() == [0] and int(batch["max_seqlen"]) == 0


def test_rows_are_fresh_arrays(one_file: Path) -> None:
    """A caller may write into a batch (mask tokens, build labels in place): that must not
    change the stored data or the next batch."""
    ds = sw.TokenDataset(one_file, seq_len=SEQ, seed=3)
    stored = _stream(ds.cache).copy()
    first = ds.get_batch([0, 1])
    for k, v in first.items():
        assert v.flags.writeable and v.flags.c_contiguous, k
        v[...] = 7
    again = ds.get_batch([0, 1])
    assert not any((again[k] == 7).all() for k in again)
    assert (_stream(ds.cache) == stored).all()


@pytest.mark.parametrize("shuffle", ["window", "document"])
def test_a_used_dataset_pickles_without_its_mapped_data(tmp_path: Path, shuffle: str) -> None:
    """Spawned DataLoader workers receive the dataset pickled: its chunk maps, window views
    and memory-mapped plans must stay behind (each would pickle as a copy of its data),
    and the copy must read the same batches."""
    import pickle

    from shardwise.bench.read_data import make_corpus

    prefix = tmp_path / "corpus"
    make_corpus(prefix, 2_000_000, seed=3)  # 4 MB of tokens, ~2,400 documents
    ds = sw.TokenDataset(prefix, seq_len=64, seed=5, shuffle=shuffle, cu_seqlens=True,
                         plan_dir=tmp_path / "plans")
    idx = list(range(0, 6400, 100))
    before = ds.get_batch(idx)
    blob = pickle.dumps(ds)
    assert len(blob) < 64 << 10, len(blob)  # the data is 4 MB
    after = pickle.loads(blob).get_batch(idx)
    assert all(np.array_equal(before[k], after[k]) for k in before)
