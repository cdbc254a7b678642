"""Document shuffle's batched read path against a reference built one example at a time
from the plan's ``pieces`` and the raw stream.

``get_batch`` reads a micro-batch's consecutive windows as one span of the shuffled stream
(one copy per stored-document piece, rows as overlapping views); other index lists fall
back to one span per run of consecutive windows. Whatever the route — one run, several,
padding rows, the short last window under ``drop_last=False``, a run that crosses into
the next epoch — every field must be the one the per-example reference gives, on a cache
of many chunks (pieces from several files per window) with empty documents in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardwise as sw
from shardwise.errors import CorruptChunkError
from shardwise.plan.doc_shuffle import build_doc_shuffle_index

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache, sample_docs  # noqa: E402

EOD = 5


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sources, chunks of 7 documents, some documents empty, id 5 as end-of-document."""
    docs = [sample_docs(300, seed=1, vocab_size=50), sample_docs(250, seed=2, vocab_size=50)]
    for source in docs:
        for k in range(0, len(source), 23):
            source.insert(k, [])
    return make_cache(tmp_path_factory.mktemp("doc") / "cache", docs, chunk_docs=7,
                      eod_id=EOD, vocab_size=50)


def _doc_starts(cache: sw.Cache) -> np.ndarray:
    lengths = np.concatenate([np.asarray(cache.doc_lengths(c), dtype=np.int64)
                              for c in range(len(cache.chunks))])
    return np.concatenate(([0], np.cumsum(lengths)))


def _reference_row(ds: sw.TokenDataset, stream: np.ndarray, starts: np.ndarray,
                   i: int) -> tuple[np.ndarray, list[int]]:
    """Example ``i``'s tokens and document starts, from ``pieces`` one by one."""
    c, n = ds.config, len(ds)
    epoch, w = divmod(i, n)
    index = build_doc_shuffle_index(np.diff(starts), seed=c.seed, epoch=epoch,
                                    seq_len=c.seq_len, drop_last=c.drop_last)
    tokens, bounds, at = [], [], 0
    for doc, off, length in index.pieces(w):
        tokens.append(stream[starts[doc] + off: starts[doc] + off + length])
        if 0 < at < c.seq_len and off == 0:
            bounds.append(at)
        at += length
    return np.concatenate(tokens), bounds


def _reference(ds: sw.TokenDataset, idx: list[int]) -> dict[str, np.ndarray]:
    c, L, B = ds.config, ds.config.seq_len, len(idx)
    stream = np.concatenate([ds.cache.tokens(k) for k in range(len(ds.cache.chunks))]
                            ).astype(np.int64)
    starts = _doc_starts(ds.cache)
    rows = np.zeros((B, L + 1), dtype=np.int64)
    mask = np.zeros((B, L), dtype=np.float32)
    positions = np.tile(np.arange(L, dtype=np.int64), (B, 1))
    cu = [0]
    for r, i in enumerate(idx):
        bounds: list[int] = []
        if i != sw.PAD:
            tokens, bounds = _reference_row(ds, stream, starts, i)
            rows[r, : len(tokens)] = tokens
            mask[r, : len(tokens) - 1] = 1.0
        for x in bounds:
            if c.reset_position_ids:
                positions[r, x:] = np.arange(L - x)
        cu += [r * L + x for x in bounds] + [(r + 1) * L]
    if c.eod_mask_loss:
        mask[rows[:, :L] == EOD] = 0.0
    out = {"input_ids": rows[:, :L], "labels": np.where(mask == 1, rows[:, 1:], -100),
           "loss_mask": mask, "position_ids": positions}
    if c.cu_seqlens:
        out["cu_seqlens"] = np.asarray(cu, dtype=np.int32)
        out["max_seqlen"] = np.asarray(int(np.diff(out["cu_seqlens"]).max()) if B else 0,
                                       dtype=np.int32)
    return out


def _assert_matches(ds: sw.TokenDataset, idx: list[int]) -> None:
    got, want = ds.get_batch(idx), _reference(ds, idx)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k} for indices {idx}")


def _runs(n: int) -> st.SearchStrategy[list[int]]:
    """Index lists as a sampler and an eval pass make them: runs of consecutive indices
    (from anywhere in three epochs, and up to the last window), padding between."""
    start = st.one_of(st.integers(0, 3 * n), st.integers(n - 6, n - 1),
                      st.integers(2 * n - 6, 2 * n - 1))
    run = st.tuples(start, st.integers(1, 9)).map(lambda t: list(range(t[0], t[0] + t[1])))
    pad = st.integers(1, 3).map(lambda k: [sw.PAD] * k)
    return st.lists(st.one_of(run, run, pad), max_size=4).map(lambda xs: sum(xs, []))


@pytest.mark.parametrize("seq_len", [4, 64])
@pytest.mark.parametrize("drop_last", [True, False])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_batches_equal_the_per_example_pieces(chunked: Path, tmp_path_factory:
                                              pytest.TempPathFactory, seq_len: int,
                                              drop_last: bool, data: st.DataObject) -> None:
    ds = sw.TokenDataset(chunked, seq_len=seq_len, seed=13, shuffle="document",
                         drop_last=drop_last, reset_position_ids=True, cu_seqlens=True,
                         eod_mask_loss=True, plan_dir=tmp_path_factory.getbasetemp() / "p")
    assert len(ds.cache.chunks) > 50
    idx = data.draw(_runs(len(ds)))
    _assert_matches(ds, idx)
    for i in idx[:3]:  # one example per call: a run of one
        _assert_matches(ds, [i])


def test_every_window_of_an_epoch_in_micro_batches(chunked: Path, tmp_path: Path) -> None:
    """What a sampler reads: consecutive micro-batches over a whole epoch, the last one
    ending in the short window, and on into the next epoch."""
    ds = sw.TokenDataset(chunked, seq_len=16, seed=2, shuffle="document", drop_last=False,
                         plan_dir=tmp_path)
    n, m = len(ds), 8
    for start in range(0, n + 2 * m, m):
        _assert_matches(ds, list(range(start, start + m)))


def test_one_file_cache_reads_the_same(chunked: Path, tmp_path: Path) -> None:
    """The same stream as one Megatron .bin (the one-chunk copy loop) gives the same rows."""
    from shardwise.writer.convert import to_megatron

    prefix = tmp_path / "corpus_text_document"
    to_megatron(chunked, prefix)
    a = sw.TokenDataset(chunked, seq_len=16, seed=4, shuffle="document", plan_dir=tmp_path)
    b = sw.TokenDataset(prefix, seq_len=16, seed=4, shuffle="document", plan_dir=tmp_path)
    assert len(b.cache.chunks) == 1
    for idx in ([0, 1, 2, 3], [7, sw.PAD, 9, 10], [len(a) - 2, len(a) - 1, len(a)]):
        got, want = b.get_batch(idx), a.get_batch(idx)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_an_id_outside_the_vocabulary_names_its_chunk(tmp_path: Path) -> None:
    """The per-batch id check on both routes (one run; runs with padding) names the chunk
    the bad id was read from."""
    docs = sample_docs(200, seed=5, vocab_size=50)
    docs[97] = [*docs[97], 77]  # chunk 97 // 7 = 13 of source 0
    root = make_cache(tmp_path / "cache", [docs], chunk_docs=7, vocab_size=50)
    stem = "chunks/00000/00000-00013.bin"
    for idx in (lambda n: list(range(n)), lambda n: [j if j % 5 else sw.PAD for j in range(n)]):
        ds = sw.TokenDataset(sw.open_cache(root), seq_len=8, seed=3, shuffle="document",
                             plan_dir=tmp_path)
        with pytest.raises(CorruptChunkError, match=rf"{stem}: token id 77"):
            ds.get_batch(idx(len(ds)))


def test_prefetch_asks_for_the_chunks_of_every_piece(chunked: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On an object store, ``prefetch`` downloads the chunks the examples' pieces are in."""
    ds = sw.TokenDataset(chunked, seq_len=16, seed=8, shuffle="document", plan_dir=tmp_path)
    cum, starts = ds.cache.cum_tokens, _doc_starts(ds.cache)
    index = build_doc_shuffle_index(np.diff(starts), seed=8, epoch=0, seq_len=16,
                                    drop_last=True)
    ds.get_batch([0])  # the plan and document starts, made while the cache is local
    asked: list[int] = []
    monkeypatch.setattr(ds.cache.store, "prefetches", True)  # as a bucket store would
    monkeypatch.setattr(ds.cache, "prefetch_runs", lambda runs: asked.extend(runs.chunks()))
    for idx in ([0, 1, 2, 3], [40, sw.PAD, 7]):
        asked.clear()
        ds.prefetch(idx)
        want = {int(np.searchsorted(cum, starts[d] + o + k, side="right")) - 1
                for i in idx if i >= 0 for d, o, n in index.pieces(i) for k in (0, n - 1)}
        assert sorted(asked) == sorted(want) and len(asked) == len(set(asked))
