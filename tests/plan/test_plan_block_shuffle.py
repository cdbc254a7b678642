"""BlockShuffle: a bijection for every configuration, that keeps reads inside few blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import BlockShuffle, Permutation


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 3000), block_size=st.integers(1, 400),
       blocks_per_group=st.integers(1, 40), seed=st.integers(0, 2**63), epoch=st.integers(0, 99))
def test_bijection_for_any_configuration(n: int, block_size: int, blocks_per_group: int,
                                         seed: int, epoch: int) -> None:
    bs = BlockShuffle(n, seed, epoch, block_size, blocks_per_group)
    out = bs(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))
    if n:
        assert bs(n - 1) == out[-1] and bs(0) == out[0]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), block_size=st.integers(1, 64), blocks_per_group=st.integers(1, 8))
def test_each_group_reads_at_most_blocks_per_group_blocks(n: int, block_size: int,
                                                          blocks_per_group: int) -> None:
    out = BlockShuffle(n, 7, 0, block_size, blocks_per_group)(np.arange(n))
    span = block_size * blocks_per_group
    for start in range(0, n, span):  # groups start at multiples of the full group size
        blocks = np.unique(out[start:start + span - block_size] // block_size)
        assert len(blocks) <= blocks_per_group


def test_degenerate_settings() -> None:
    idx = np.arange(1000)
    full = BlockShuffle(1000, 5, 2, block_size=1, blocks_per_group=1)(idx)
    assert np.array_equal(full, Permutation(1000, seed=5, epoch=2)(idx))
    inside_blocks = BlockShuffle(1000, 5, 2, block_size=10, blocks_per_group=1)(idx)
    assert all(len(np.unique(inside_blocks[i:i + 10] // 10)) == 1 for i in range(0, 1000, 10))
    assert not np.array_equal(inside_blocks % 10, idx % 10)  # windows shuffled inside blocks
    one_block = BlockShuffle(50, 5, 2, block_size=10**12, blocks_per_group=10**12)(idx[:50])
    assert np.array_equal(np.sort(one_block), idx[:50])


def test_docstring_example() -> None:
    bs = BlockShuffle(n=10, seed=0, epoch=0, block_size=3, blocks_per_group=2)
    assert bs(np.arange(10)).tolist() == [5, 6, 8, 4, 7, 3, 0, 1, 9, 2]


def test_epochs_differ_and_large_n_works() -> None:
    idx = np.arange(100_000, 100_064)
    a = BlockShuffle(10**12, 1, 0, 4096, 16)(idx)
    b = BlockShuffle(10**12, 1, 1, 4096, 16)(idx)
    assert not np.array_equal(a, b)
    assert ((a >= 0) & (a < 10**12)).all()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        BlockShuffle(10, 0, 0, 0, 1)
    with pytest.raises(ValueError, match=r"in \[0, 10\), got 10"):
        BlockShuffle(10, 0, 0, 2, 2)(10)
