"""TokenDataset: windows, packing, options, and the global order (single process)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.errors import ConfigError
from shardwise.plan.doc_shuffle import DocShuffleIndex


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path,
              tokenizer_path: Path) -> Path:
    out = tmp_path_factory.mktemp("td") / "cache"
    sw.build([sample_corpus], out, tokenizer=tokenizer_path, chunk_docs=16, append_eod=True,
             workers=2, progress=False)
    return out


def _stream(cache: sw.Cache) -> np.ndarray:
    return np.concatenate([cache.tokens(i) for i in range(len(cache.chunks))]).astype(np.int64)


def test_windows_are_shifted_slices_of_the_stream(cache_dir: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=32, seed=7)
    stream = _stream(sw.open_cache(cache_dir))
    assert len(ds) == (len(stream) - 1) // 32
    idx = list(range(0, 3 * len(ds), 97))  # three epochs
    batch = ds.__getitems__(idx)
    for row, w in enumerate(ds.windows(idx)):
        window = stream[w * 32: w * 32 + 33]
        assert (batch["input_ids"][row] == window[:-1]).all()
        assert (batch["labels"][row] == window[1:]).all()
    single = ds[idx[5]]
    assert all((single[k] == batch[k][5]).all() for k in single)
    assert batch["loss_mask"].min() == 1.0 and batch["position_ids"][0, 5] == 5


@pytest.mark.parametrize("shuffle", ["none", "window", "block"])
def test_each_epoch_covers_every_window_once(cache_dir: Path, shuffle: str) -> None:
    block = {"block_size": 8, "blocks_per_group": 4} if shuffle == "block" else {}
    ds = sw.TokenDataset(cache_dir, seq_len=32, seed=3, shuffle=shuffle, **block)
    n = len(ds)
    for epoch in range(3):
        w = ds.windows(np.arange(epoch * n, (epoch + 1) * n))
        assert sorted(w.tolist()) == list(range(n))
    e0, e1 = ds.windows(np.arange(n)), ds.windows(np.arange(n, 2 * n))
    assert (shuffle == "none") == bool((e0 == e1).all())


def test_order_depends_on_seed_only(cache_dir: Path) -> None:
    a = sw.TokenDataset(cache_dir, seq_len=32, seed=1).windows(np.arange(100))
    b = sw.TokenDataset(cache_dir, seq_len=32, seed=1).windows(np.arange(100))
    c = sw.TokenDataset(cache_dir, seq_len=32, seed=2).windows(np.arange(100))
    assert (a == b).all() and not (a == c).all()


def test_last_partial_window_is_padded_and_masked(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    seq = 1000
    keep = sw.TokenDataset(cache, seq_len=seq, shuffle="none", drop_last=False)
    drop = sw.TokenDataset(cache, seq_len=seq, shuffle="none", drop_last=True)
    assert len(keep) == len(drop) + 1
    last = keep[len(keep) - 1]
    valid = cache.num_tokens - (len(keep) - 1) * seq  # tokens in the last window
    assert last["loss_mask"][: valid - 1].min() == 1 and last["loss_mask"][valid - 1:].max() == 0
    assert (last["input_ids"][:valid] == _stream(cache)[-valid:]).all()


def test_padding_index_gives_a_masked_row(cache_dir: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=32)
    batch = ds.__getitems__([0, sw.PAD])
    assert batch["loss_mask"][1].max() == 0 and batch["loss_mask"][0].min() == 1
    with pytest.raises(IndexError):
        ds.__getitems__([-2])


def test_reset_positions_cu_seqlens_and_eod_mask(cache_dir: Path) -> None:
    cache = sw.open_cache(cache_dir)
    ds = sw.TokenDataset(cache, seq_len=64, seed=5, reset_position_ids=True, cu_seqlens=True,
                         eod_mask_loss=True)
    eod = cache.eod_id
    idx = list(range(40))
    batch = ds.__getitems__(idx)
    for r in range(len(idx)):
        inputs = batch["input_ids"][r]
        # with --append-eod every document ends in eod: a new one starts after each eod
        starts = [0] + [j + 1 for j in np.flatnonzero(inputs[:-1] == eod)]
        expected_pos = np.concatenate([np.arange(b - a) for a, b in
                                       zip(starts, starts[1:] + [64], strict=True)])
        assert (batch["position_ids"][r] == expected_pos).all()
        assert (batch["loss_mask"][r] == (inputs != eod)).all()
    cu = batch["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == 64 * len(idx) and (np.diff(cu) > 0).all()
    assert set(range(0, 64 * len(idx) + 1, 64)) <= set(cu.tolist())
    assert int(batch["max_seqlen"]) == int(np.diff(cu).max())


def test_document_shuffle_packs_whole_documents_and_caches_its_plan(cache_dir: Path,
                                                                     tmp_path: Path) -> None:
    cache = sw.open_cache(cache_dir)
    ds = sw.TokenDataset(cache, seq_len=64, seed=9, shuffle="document", plan_dir=tmp_path,
                         drop_last=False)
    n = len(ds)
    batch = ds.__getitems__(list(range(n)))
    mask = batch["loss_mask"].astype(bool)
    # every token is a label exactly once: the multiset of labels equals the stream's
    stream = _stream(cache)
    got = np.sort(batch["labels"][mask])
    first = batch["input_ids"][0, 0]  # the shuffled stream's first token is never a label
    expected = np.sort(np.delete(stream, np.flatnonzero(stream == first)[0]))
    assert (got == expected).all()
    plans = sorted(p.name for p in tmp_path.iterdir())
    assert any(p.endswith(".doc_order.npy") for p in plans)
    # a second dataset loads the cached plan (memory-mapped) instead of planning again
    again = sw.TokenDataset(cache, seq_len=64, seed=9, shuffle="document", plan_dir=tmp_path,
                            drop_last=False)
    index = again.order.plan(0)
    assert isinstance(index, DocShuffleIndex) and isinstance(index.doc_order, np.memmap)
    assert (again.__getitems__([0, 5])["input_ids"] == batch["input_ids"][[0, 5]]).all()


def test_document_shuffle_order_differs_per_epoch(cache_dir: Path, tmp_path: Path) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=64, seed=9, shuffle="document", plan_dir=tmp_path)
    n = len(ds)
    a = ds.__getitems__([0, 1, 2])["input_ids"]
    b = ds.__getitems__([n, n + 1, n + 2])["input_ids"]
    assert not (a == b).all()


def test_bad_options_are_named(cache_dir: Path) -> None:
    with pytest.raises(ConfigError, match="shuffle must be one of"):
        sw.TokenDataset(cache_dir, seq_len=32, shuffle="random")
    with pytest.raises(ConfigError, match="seq_len must be a positive integer"):
        sw.TokenDataset(cache_dir, seq_len=0)
    tracemalloc.start()  # refused before anything of seq_len's size is allocated (8 GB)
    try:
        with pytest.raises(ConfigError, match="not one window"):
            sw.TokenDataset(cache_dir, seq_len=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak:,} bytes"


def test_megatron_prefix_reads_the_same_windows(cache_dir: Path, tmp_path: Path) -> None:
    from shardwise.writer.convert import to_megatron

    to_megatron(cache_dir, tmp_path / "corpus_text_document")
    a = sw.TokenDataset(cache_dir, seq_len=32, seed=4)
    b = sw.TokenDataset(tmp_path / "corpus_text_document", seq_len=32, seed=4)
    assert len(a) == len(b)
    idx = list(range(0, len(a), 13))
    assert (a.__getitems__(idx)["input_ids"] == b.__getitems__(idx)["input_ids"]).all()
