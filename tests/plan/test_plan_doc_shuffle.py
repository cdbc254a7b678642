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
    num_windows,
    plan_fingerprint,
)
from shardwise.plan.doc_shuffle import doc_shuffle_blocks
from shardwise.read.tokens.plans import load_or_build

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


PARAMS = {"seed": 3, "epoch": 0, "seq_len": 16, "drop_last": True}


def test_load_or_build_caches_and_memory_maps(tmp_path: Path) -> None:
    lengths = np.arange(0, 500) % 37
    key = {"cache": "abc", **PARAMS}
    calls = []

    def doc_lengths() -> np.ndarray:
        calls.append(1)
        return lengths

    first = load_or_build(tmp_path, key, doc_lengths, block=64, **PARAMS)
    second = load_or_build(tmp_path, key, doc_lengths, **PARAMS)
    assert len(calls) == 1  # a cached plan reads no lengths
    assert isinstance(second.doc_order, np.memmap) and not second.doc_order.flags.writeable
    expected = build_doc_shuffle_index(lengths, **PARAMS)
    assert second.doc_order.dtype == np.int32  # ids fit: half the bytes (layout 2)
    assert np.array_equal(first.doc_order, expected.doc_order)
    assert np.array_equal(first.cum_tokens, expected.cum_tokens)
    assert [second.pieces(w) for w in range(second.n_windows)] == \
        [expected.pieces(w) for w in range(expected.n_windows)]
    names = sorted(p.name for p in tmp_path.iterdir())
    fp = plan_fingerprint(key)
    assert names == [f"{fp}.cum_tokens.npy", f"{fp}.doc_order.npy", f"{fp}.json", f"{fp}.lock",
                     "verified"]  # the node's record of the plan files it hashed
    (log,) = (tmp_path / "verified").iterdir()
    assert [line.split()[0] for line in log.read_text().splitlines()] == [
        f"{fp}.doc_order.npy", f"{fp}.cum_tokens.npy"]  # hashed once, by the first load
    load_or_build(tmp_path, {"cache": "abc"}, doc_lengths, **{**PARAMS, "epoch": 1})
    assert len(calls) == 2  # another key is another plan


def test_blocks_make_the_same_plan_as_one_pass() -> None:
    lengths = np.arange(1000) % 13
    whole = build_doc_shuffle_index(lengths, **PARAMS)
    parts = list(doc_shuffle_blocks(lengths, seed=3, epoch=0, block=97))
    assert np.array_equal(np.concatenate([o for o, _ in parts]), whole.doc_order)
    assert np.array_equal(np.concatenate([e for _, e in parts]), whole.cum_tokens[1:])


@pytest.mark.parametrize("layout", [1, 2])
def test_plans_without_checksums_are_rebuilt_once(tmp_path: Path, layout: int) -> None:
    """A plan written before layout 3 (no checksums: layout 1's int64 doc_order without a
    layout key, layout 2's int32) is rebuilt, to the same order, and then kept."""
    lengths = np.arange(50) % 7
    index = build_doc_shuffle_index(lengths, **PARAMS)
    fp = plan_fingerprint({"cache": "old", **PARAMS})
    dtype = np.int64 if layout == 1 else np.int32
    np.save(tmp_path / f"{fp}.doc_order.npy", np.asarray(index.doc_order, dtype=dtype))
    np.save(tmp_path / f"{fp}.cum_tokens.npy", np.asarray(index.cum_tokens))
    (tmp_path / f"{fp}.json").write_text(json.dumps({
        "version": 1, "permutation_version": 1, "seq_len": 16, "drop_last": True,
        "n_docs": 50, "total_tokens": index.total_tokens,
        **({"layout": 2, "doc_order_dtype": "int32"} if layout == 2 else {})}))
    with pytest.raises(ValueError, match=f"plan layout {layout} .no checksums"):
        DocShuffleIndex.load(tmp_path, fp)
    built: list[int] = []
    loaded = load_or_build(tmp_path, {"cache": "old"}, lambda: built.append(1) or lengths,
                           **PARAMS)
    assert built == [1] and loaded.doc_order.dtype == np.int32
    assert np.array_equal(loaded.doc_order, index.doc_order)
    load_or_build(tmp_path, {"cache": "old"}, lambda: pytest.fail("rebuilt"), **PARAMS)


def test_fingerprint_is_order_independent_and_strict() -> None:
    assert plan_fingerprint({"a": 1, "b": [1, 2]}) == plan_fingerprint({"b": [1, 2], "a": 1})
    assert plan_fingerprint({"a": 1}) != plan_fingerprint({"a": 2})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        plan_fingerprint({"a": object()})


def _damage(directory: Path, fp: str, how: str) -> None:
    meta = directory / f"{fp}.json"
    if how == "other n_docs":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "n_docs": 7}))
    elif how == "truncated array":
        path = directory / f"{fp}.cum_tokens.npy"
        path.write_bytes(path.read_bytes()[:-8])
    elif how == "bad header":
        (directory / f"{fp}.cum_tokens.npy").write_bytes(b"\x93NUMPY truncated")
    elif how == "other total":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "total_tokens": 1}))
    else:
        meta.write_text("{not json")


DAMAGE = {"other n_docs": r"doc_order.npy: expected int32 of shape \(7,\)",
          "truncated array": r"cum_tokens.npy: xxh3_64 \w+, published as \w+",
          "bad header": r"cum_tokens.npy: xxh3_64 \w+, published as \w+",
          "other total": r"cum_tokens.npy: runs from 0 to 12, the metadata says 0 to 1",
          "bad json": "unreadable plan metadata"}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_plans_are_refused_then_rebuilt_never_used(tmp_path: Path, how: str) -> None:
    key, params = {"k": 1}, {**PARAMS, "seq_len": 4}
    built = []

    def doc_lengths() -> list[int]:
        built.append(1)
        return [3, 4, 5]

    load_or_build(tmp_path, key, doc_lengths, **params)  # unmapped again: damage is in place
    good = build_doc_shuffle_index([3, 4, 5], **params)
    fp = plan_fingerprint({**key, **params})
    _damage(tmp_path, fp, how)
    with pytest.raises(ValueError, match=DAMAGE[how]):  # the file itself is refused, named
        DocShuffleIndex.load(tmp_path, fp)
    again = load_or_build(tmp_path, key, doc_lengths, **params)  # and rebuilt, once
    assert len(built) == 2
    assert np.array_equal(again.doc_order, good.doc_order)
    assert np.array_equal(again.cum_tokens, good.cum_tokens)
    assert DocShuffleIndex.load(tmp_path, fp) is not None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_bad_plan_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="disagree with the plan's parameters"):
        load_or_build(tmp_path, {"seed": 4}, lambda: [1], **PARAMS)
    with pytest.raises(ValueError, match="doc_lengths must be >= 0"):
        load_or_build(tmp_path, {"k": 2}, lambda: [1, -1], **PARAMS)
