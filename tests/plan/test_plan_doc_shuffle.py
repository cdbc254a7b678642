"""Document shuffle: windows cover every token once; the index is cached and memory-mapped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import (
    DocShuffleIndex,
    build_doc_shuffle_index,
    load_or_build,
    num_windows,
    plan_fingerprint,
)

LENGTHS = st.lists(st.integers(0, 40), min_size=0, max_size=60)


@settings(max_examples=120, deadline=None)
@given(lengths=LENGTHS, seq_len=st.integers(1, 33), seed=st.integers(0, 2**32),
       drop_last=st.booleans())
def test_windows_cover_every_token_once(lengths: list[int], seq_len: int, seed: int,
                                        drop_last: bool) -> None:
    index = build_doc_shuffle_index(np.asarray(lengths, dtype=np.int64), seed=seed, epoch=1,
                                    seq_len=seq_len, drop_last=drop_last)
    total = sum(lengths)
    assert index.n_windows == num_windows(total, seq_len, drop_last=drop_last)
    covered = [np.zeros(n, dtype=np.int64) for n in lengths]
    stream: list[tuple[int, int]] = []
    for w in range(index.n_windows):
        pieces = index.pieces(w)
        start, stop = index.span(w)
        assert sum(length for _, _, length in pieces) == stop - start
        tokens = [(d, o + k) for d, o, n in pieces for k in range(n)]
        owned = tokens if w == index.n_windows - 1 and stop == total else tokens[:-1]
        for d, t in owned:
            covered[d][t] += 1
        stream.extend(owned)
    flat = np.concatenate(covered) if covered else np.zeros(0)
    if drop_last:
        assert (flat <= 1).all() and total - flat.sum() <= seq_len
    else:  # a stream of one token has no label, hence no window
        assert (flat == 1).all() if total >= 2 else not flat.any()
    expected = [(int(d), t) for d in index.doc_order for t in range(lengths[d])]
    assert stream == expected[:len(stream)]  # documents appear whole, in shuffled order


@settings(max_examples=120, deadline=None)
@given(lengths=LENGTHS, seed=st.integers(0, 2**32), data=st.data())
def test_any_span_is_the_shuffled_stream(lengths: list[int], seed: int,
                                         data: st.DataObject) -> None:
    """``span_pieces`` (what the reader calls, once per run of windows) names exactly the
    shuffled stream's tokens of any span; an empty or out-of-range span is refused."""
    index = build_doc_shuffle_index(np.asarray(lengths, dtype=np.int64), seed=seed, epoch=0,
                                    seq_len=4, drop_last=False)
    stream = [(int(d), k) for d in index.doc_order for k in range(lengths[int(d)])]
    total = len(stream)
    if total == 0:
        with pytest.raises(ValueError, match="not a non-empty part"):
            index.span_pieces(0, 1)
        return
    start = data.draw(st.integers(0, total - 1))
    stop = data.draw(st.integers(start + 1, total))
    docs, skip, end = index.span_pieces(start, stop)
    got = [(int(d), k) for j, d in enumerate(docs)
           for k in range(skip if j == 0 else 0, end if j == len(docs) - 1 else lengths[d])]
    assert got == stream[start:stop]
    for bad in ((start, start), (-1, stop), (start, total + 1)):
        with pytest.raises(ValueError, match="not a non-empty part"):
            index.span_pieces(*bad)


def test_order_depends_on_seed_and_epoch_and_is_a_permutation() -> None:
    lengths = np.arange(1, 101)
    a = build_doc_shuffle_index(lengths, seed=1, epoch=0, seq_len=8, drop_last=True)
    b = build_doc_shuffle_index(lengths, seed=1, epoch=1, seq_len=8, drop_last=True)
    assert np.array_equal(np.sort(a.doc_order), np.arange(100))
    assert not np.array_equal(a.doc_order, b.doc_order)
    assert a.total_tokens == lengths.sum()


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="doc_lengths must be >= 0, got -1 at document 1"):
        build_doc_shuffle_index([3, -1], seed=0, epoch=0, seq_len=4, drop_last=True)
    with pytest.raises(ValueError, match="1-d integer array"):
        build_doc_shuffle_index([1.5], seed=0, epoch=0, seq_len=4, drop_last=True)
    index = build_doc_shuffle_index([3, 5], seed=0, epoch=0, seq_len=4, drop_last=True)
    with pytest.raises(ValueError, match=r"windows must be in \[0, 1\), got 1"):
        index.pieces(1)


def test_load_or_build_caches_and_memory_maps(tmp_path: Path) -> None:
    lengths = np.arange(0, 500) % 37
    key = {"cache": "abc", "seed": 3, "epoch": 0, "seq_len": 16, "drop_last": True}
    calls = []

    def build() -> DocShuffleIndex:
        calls.append(1)
        return build_doc_shuffle_index(lengths, seed=3, epoch=0, seq_len=16, drop_last=True)

    first = load_or_build(tmp_path, key, build)
    second = load_or_build(tmp_path, key, build)
    assert len(calls) == 1
    assert isinstance(second.doc_order, np.memmap) and not second.doc_order.flags.writeable
    assert np.array_equal(first.doc_order, build().doc_order)
    assert [second.pieces(w) for w in range(second.n_windows)] == \
        [first.pieces(w) for w in range(first.n_windows)]
    names = sorted(p.name for p in tmp_path.iterdir())
    fp = plan_fingerprint(key)
    assert names == [f"{fp}.cum_tokens.npy", f"{fp}.doc_order.npy", f"{fp}.json"]
    load_or_build(tmp_path, {**key, "epoch": 1}, build)
    assert len(calls) == 3  # another key is another plan


def test_fingerprint_is_order_independent_and_strict() -> None:
    assert plan_fingerprint({"a": 1, "b": [1, 2]}) == plan_fingerprint({"b": [1, 2], "a": 1})
    assert plan_fingerprint({"a": 1}) != plan_fingerprint({"a": 2})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        plan_fingerprint({"a": object()})


def test_damaged_files_are_named(tmp_path: Path) -> None:
    key = {"k": 1}

    def build() -> DocShuffleIndex:
        return build_doc_shuffle_index([3, 4, 5], seed=0, epoch=0, seq_len=4, drop_last=True)

    load_or_build(tmp_path, key, build)
    fp = plan_fingerprint(key)
    meta = tmp_path / f"{fp}.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "n_docs": 7}))
    with pytest.raises(ValueError, match=rf"{fp}.doc_order.npy: expected int64 of shape \(7,\)"):
        load_or_build(tmp_path, key, build)
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "n_docs": 3}))
    (tmp_path / f"{fp}.cum_tokens.npy").write_bytes(b"\x93NUMPY truncated")
    with pytest.raises(ValueError, match=rf"{fp}.cum_tokens.npy: cannot be read as .npy"):
        load_or_build(tmp_path, key, build)
    meta.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable plan metadata"):
        load_or_build(tmp_path, key, build)
    with pytest.raises(ValueError, match="must return a DocShuffleIndex"):
        load_or_build(tmp_path, {"k": 2}, lambda: None)  # type: ignore[arg-type,return-value]
