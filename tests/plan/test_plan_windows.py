"""Packing: windows tile the token stream with one shared token; document boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import (
    cu_seqlens,
    document_boundaries,
    locate,
    num_windows,
    position_ids,
    window_span,
)
from shardwise.plan.windows import dropped_tokens


def test_module_docstring_example() -> None:
    assert num_windows(11, 4, drop_last=True) == 2
    assert num_windows(11, 4, drop_last=False) == 3
    assert window_span(2, 4, 11) == (8, 11)
    assert num_windows(0, 4, drop_last=False) == 0
    assert num_windows(1, 4, drop_last=False) == 0
    assert num_windows(5, 4, drop_last=True) == 1


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 5000), seq_len=st.integers(1, 300), drop_last=st.booleans())
def test_windows_tile_the_stream(total: int, seq_len: int, drop_last: bool) -> None:
    n = num_windows(total, seq_len, drop_last=drop_last)
    start, stop = window_span(np.arange(n), seq_len, total)
    covered = np.zeros(total, dtype=np.int64)
    for a, b in zip(start.tolist(), stop.tolist(), strict=True):
        covered[a:b - 1] += 1  # each window owns all but its last (shared) token
    if drop_last:
        assert (stop - start == seq_len + 1).all()
        assert (covered <= 1).all() and total - 1 - covered.sum() < seq_len
        assert covered[:covered.sum()].all()
    else:
        assert (covered[:max(total - 1, 0)] == 1).all()
        assert n == 0 or stop[-1] == total
    assert np.array_equal(start[1:], start[:-1] + seq_len)
    held = np.zeros(total, dtype=bool)  # tokens some window holds, as input or label
    for a, b in zip(start.tolist(), stop.tolist(), strict=True):
        held[a:b] = True
    assert dropped_tokens(total, seq_len, drop_last=drop_last) == total - held.sum()


def test_dropped_tokens_docstring_example() -> None:
    assert dropped_tokens(11, 4, drop_last=True) == 2
    assert dropped_tokens(11, 4, drop_last=False) == 0
    assert dropped_tokens(4, 4, drop_last=True) == 4  # not one window: all of it


def test_window_span_refuses_missing_windows() -> None:
    with pytest.raises(ValueError, match=r"windows must be in \[0, 3\), got 3"):
        window_span(3, 4, 11)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        num_windows(10, 0, drop_last=True)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=30).filter(lambda s: sum(s) > 0))
def test_locate_finds_every_token(sizes: list[int]) -> None:
    cum = np.concatenate([[0], np.cumsum(sizes)])
    chunk, offset = locate(np.arange(cum[-1]), cum)
    expected_chunk = np.repeat(np.arange(len(sizes)), sizes)
    expected_offset = np.concatenate([np.arange(s) for s in sizes])
    assert np.array_equal(chunk, expected_chunk)
    assert np.array_equal(offset, expected_offset)


def test_locate_docstring_example_and_errors() -> None:
    chunk, offset = locate([0, 4, 5, 8], [0, 5, 5, 9])
    assert chunk.tolist() == [0, 0, 2, 2] and offset.tolist() == [0, 4, 0, 3]
    with pytest.raises(ValueError, match=r"token offsets must be in \[0, 9\), got 9"):
        locate([9], [0, 5, 5, 9])
    with pytest.raises(ValueError, match="start at 0"):
        locate([0], [1, 5])


def test_boundaries_position_ids_and_cu_seqlens() -> None:
    starts = np.array([0, 3, 7, 12])
    assert document_boundaries(starts, 5, 10).tolist() == [2]
    assert document_boundaries(starts, 3, 10).tolist() == [0, 4]
    assert document_boundaries([0, 2, 2, 5, 6], 0, 6).tolist() == [0, 2, 5]
    assert position_ids(6, [2, 5]).tolist() == [0, 1, 0, 1, 2, 0]
    assert cu_seqlens(6, [2, 5]).tolist() == [0, 2, 5, 6]
    assert cu_seqlens(6, [0, 2, 5]).tolist() == [0, 2, 5, 6]
    assert cu_seqlens(6, [2, 5]).dtype == np.int32
    assert position_ids(4, []).tolist() == [0, 1, 2, 3]
    assert cu_seqlens(0, []).tolist() == [0]


@settings(max_examples=100, deadline=None)
@given(length=st.integers(1, 200), data=st.data())
def test_position_ids_restart_at_each_segment(length: int, data: st.DataObject) -> None:
    bounds = sorted(set(data.draw(st.lists(st.integers(0, length - 1), max_size=20))))
    pos = position_ids(length, bounds)
    cu = cu_seqlens(length, bounds)
    expected = np.concatenate([np.arange(b - a) for a, b in zip(cu[:-1], cu[1:], strict=True)])
    assert np.array_equal(pos, expected)
