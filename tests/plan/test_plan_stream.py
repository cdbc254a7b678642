"""Stream placement: round trips, rank/stream ownership, chunk shuffle inside blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import (
    chunks_of_stream,
    global_to_stream,
    num_windows,
    rank_example_to_global,
    shuffled_stream_chunks,
    stream_to_global,
    streams_of_rank,
    streams_per_rank,
)
from shardwise.plan.stream import dropped_block_tokens, dropped_stream_tokens


@settings(max_examples=100, deadline=None)
@given(n_streams=st.integers(1, 64), data=st.data())
def test_round_trips(n_streams: int, data: st.DataObject) -> None:
    i = np.asarray(data.draw(st.lists(st.integers(0, 2**50), min_size=1, max_size=30)))
    s, k = global_to_stream(i, n_streams)
    assert ((s >= 0) & (s < n_streams)).all()
    assert np.array_equal(stream_to_global(s, k, n_streams), i)
    world = data.draw(st.sampled_from([d for d in range(1, n_streams + 1) if n_streams % d == 0]))
    for r in range(world):
        j = np.arange(50)
        g = rank_example_to_global(j, r, world)
        assert np.isin(g % n_streams, streams_of_rank(r, world, n_streams)).all()


def test_scalars() -> None:
    assert global_to_stream(13, 4) == (1, 3)
    assert stream_to_global(1, 3, 4) == 13
    assert rank_example_to_global(5, 1, 2) == 11


@pytest.mark.parametrize(("world", "n_streams"), [(1, 8), (2, 8), (4, 8), (8, 8), (3, 12)])
def test_ranks_partition_streams_and_chunks(world: int, n_streams: int) -> None:
    n_chunks = 37
    streams = [streams_of_rank(r, world, n_streams) for r in range(world)]
    assert np.array_equal(np.sort(np.concatenate(streams)), np.arange(n_streams))
    assert streams_per_rank(world, n_streams) == n_streams // world
    chunks = np.concatenate([chunks_of_stream(s, n_chunks, n_streams) for s in range(n_streams)])
    assert np.array_equal(np.sort(chunks), np.arange(n_chunks))
    if world == n_streams:  # the chunk_idx % world_size == rank layout
        for r in range(world):
            owned = chunks_of_stream(int(streams[r][0]), n_chunks, n_streams)
            assert (owned % world == r).all()


def test_global_order_is_the_same_for_every_dividing_world_size() -> None:
    n_streams = 8
    reference = np.arange(200)
    for world in (1, 2, 4, 8):
        per_rank = [rank_example_to_global(np.arange(200 // world), r, world)
                    for r in range(world)]
        merged = np.stack(per_rank, axis=1).reshape(-1)  # step j: rank 0, 1, ...
        assert np.array_equal(merged, reference)
        s, _ = global_to_stream(merged, n_streams)
        assert np.array_equal(s % world, np.tile(np.arange(world), 200 // world))


def test_world_that_does_not_divide_streams_reads_shared_streams() -> None:
    assert streams_of_rank(0, 5, 12).tolist() == list(range(12))  # gcd 1: every stream
    assert streams_of_rank(3, 8, 12).tolist() == [3, 7, 11]       # gcd 4
    assert streams_of_rank(5, 8, 4).tolist() == [1]               # 8 = 2 x 4
    assert streams_per_rank(5, 12) == 12 and streams_per_rank(8, 4) == 1


@settings(max_examples=60, deadline=None)
@given(n_chunks=st.integers(0, 300), n_streams=st.integers(1, 8), block=st.integers(1, 20),
       seed=st.integers(0, 2**32), data=st.data())
def test_chunk_shuffle_is_a_permutation_inside_blocks(n_chunks: int, n_streams: int,
                                                      block: int, seed: int,
                                                      data: st.DataObject) -> None:
    s = data.draw(st.integers(0, n_streams - 1))
    plain = chunks_of_stream(s, n_chunks, n_streams)
    shuffled = shuffled_stream_chunks(s, n_chunks, n_streams, seed=seed, epoch=0,
                                      block_chunks=block)
    for b in range(0, plain.size, block):
        assert np.array_equal(np.sort(shuffled[b:b + block]), plain[b:b + block])
    grown = shuffled_stream_chunks(s, n_chunks + 50, n_streams, seed=seed, epoch=0,
                                   block_chunks=block)
    full = (plain.size // block) * block
    assert np.array_equal(grown[:full], shuffled[:full])  # full blocks never change


def test_chunk_shuffle_degenerates_and_depends_on_stream() -> None:
    assert np.array_equal(shuffled_stream_chunks(1, 40, 4, seed=1, epoch=0, block_chunks=1),
                          chunks_of_stream(1, 40, 4))
    a = shuffled_stream_chunks(0, 400, 4, seed=1, epoch=0, block_chunks=100) // 4
    b = shuffled_stream_chunks(1, 400, 4, seed=1, epoch=0, block_chunks=100) // 4
    c = shuffled_stream_chunks(0, 400, 4, seed=1, epoch=1, block_chunks=100) // 4
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_dropped_block_tokens_docstring_example() -> None:
    assert dropped_block_tokens([5, 4, 9], 2, 4, drop_last=True) == 0
    assert dropped_block_tokens([13, 11], 1, 4, drop_last=True) == 2
    assert dropped_block_tokens([13, 11], 1, 4, drop_last=False) == 0
    assert dropped_block_tokens([3, 1], 1, 4, drop_last=True) == 4  # no window at all


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 60), max_size=20), block_chunks=st.integers(1, 4),
       seq_len=st.integers(1, 16), drop_last=st.booleans())
def test_dropped_block_tokens_is_what_no_window_holds(tokens: list[int], block_chunks: int,
                                                      seq_len: int, drop_last: bool) -> None:
    held = 0
    for b in range(0, len(tokens), block_chunks):  # each block on its own, by the docs' rule
        t = sum(tokens[b:b + block_chunks])
        w = num_windows(t, seq_len, drop_last=drop_last)
        held += min(t, w * seq_len + 1) if w else 0
    got = dropped_block_tokens(tokens, block_chunks, seq_len, drop_last)
    assert got == sum(tokens) - held
    cum = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
    assert dropped_stream_tokens(cum, 1, block_chunks, seq_len, drop_last,
                                 full_blocks_only=False) == got
