"""Sampling math: ranks simulated in one process, for several world sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import (
    cyclic_micro_batch_indices,
    epoch_and_offset,
    eval_micro_batch_indices,
    micro_batch_indices,
    num_eval_steps,
    num_micro_batches,
    validate_batch_layout,
)

WORLDS = [1, 2, 4, 8]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("consumed", [0, 48])
def test_single_ranks_concatenate_to_the_global_order(world: int, consumed: int) -> None:
    m, steps = 3, 5
    got = [micro_batch_indices(k, rank=r, world_size=world, micro_batch_size=m,
                               consumed=consumed)
           for k in range(steps) for r in range(world)]
    assert np.array_equal(np.concatenate(got), np.arange(consumed, consumed + steps * m * world))


def test_single_global_order_does_not_depend_on_world_size() -> None:
    gbs = 16
    orders = []
    for world in WORLDS:
        m = 2
        acc = validate_batch_layout(gbs, m, world)
        batch0 = [micro_batch_indices(k, rank=r, world_size=world, micro_batch_size=m)
                  for k in range(acc) for r in range(world)]
        orders.append(np.sort(np.concatenate(batch0)))
    assert all(np.array_equal(o, np.arange(gbs)) for o in orders)


def test_num_micro_batches() -> None:
    assert num_micro_batches(100, world_size=4, micro_batch_size=3) == 8
    assert num_micro_batches(100, world_size=4, micro_batch_size=3, consumed=96) == 0
    assert num_micro_batches(10, world_size=4, micro_batch_size=3, consumed=20) == 0


def test_validate_batch_layout_says_what_works() -> None:
    assert validate_batch_layout(64, 8, 2) == 4
    with pytest.raises(ValueError, match=r"8 \* 3 = 24, got 64; world sizes that work with "
                                         r"micro_batch_size=8: \[1, 2, 4, 8\]"):
        validate_batch_layout(64, 8, 3)
    with pytest.raises(ValueError, match="first make it a multiple of micro_batch_size=5"):
        validate_batch_layout(64, 5, 1)
    with pytest.raises(ValueError, match="rank must be in"):
        micro_batch_indices(0, rank=2, world_size=2, micro_batch_size=1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), m=st.integers(1, 6), world=st.sampled_from(WORLDS),
       sharding=st.booleans(), seed=st.integers(0, 2**32))
def test_cyclic_epochs_are_permutations_and_ranks_disjoint(n: int, m: int, world: int,
                                                           sharding: bool, seed: int) -> None:
    mw = m * world
    if n < mw:
        with pytest.raises(ValueError, match="needs at least"):
            cyclic_micro_batch_indices(0, n=n, rank=0, world_size=world, micro_batch_size=m,
                                       seed=seed, data_sharding=sharding)
        return
    steps = n // mw  # one epoch
    epochs = []
    for e in range(2):
        per_rank = [np.concatenate([
            cyclic_micro_batch_indices(e * steps + k, n=n, rank=r, world_size=world,
                                       micro_batch_size=m, seed=seed, data_sharding=sharding)
            for k in range(steps)]) for r in range(world)]
        everything = np.concatenate(per_rank)
        assert len(np.unique(everything)) == steps * mw  # no repeats, ranks disjoint
        assert ((everything >= 0) & (everything < n)).all()
        if sharding:
            assert np.array_equal(np.sort(everything), np.arange(steps * mw))
            bucket = steps * m
            for r, part in enumerate(per_rank):
                assert ((part >= r * bucket) & (part < (r + 1) * bucket)).all()
        epochs.append(everything)
    if steps * mw >= 10:
        assert not np.array_equal(epochs[0], epochs[1])  # reshuffled


@pytest.mark.parametrize("sharding", [True, False])
def test_cyclic_resumes_from_consumed(sharding: bool) -> None:
    kw = {"n": 103, "world_size": 4, "micro_batch_size": 2, "seed": 9, "data_sharding": sharding}
    for k in range(0, 30, 7):
        for r in range(4):
            direct = cyclic_micro_batch_indices(k + 3, rank=r, **kw)  # type: ignore[arg-type]
            resumed = cyclic_micro_batch_indices(k, rank=r, consumed=3 * 8,
                                                 **kw)  # type: ignore[arg-type]
            assert np.array_equal(direct, resumed)


def test_cyclic_without_sharding_is_the_permuted_single_order() -> None:
    from shardwise.plan import Permutation

    got = np.concatenate([cyclic_micro_batch_indices(k, n=50, rank=r, world_size=2,
                                                     micro_batch_size=3, seed=4,
                                                     data_sharding=False)
                          for k in range(8) for r in range(2)])
    assert np.array_equal(got, Permutation(50, seed=4, epoch=0)(np.arange(48)))
    with pytest.raises(ValueError, match="multiple of micro_batch_size \\* world_size = 6"):
        cyclic_micro_batch_indices(0, n=50, rank=0, world_size=2, micro_batch_size=3, seed=4,
                                   consumed=5)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), m=st.integers(1, 7), world=st.sampled_from(WORLDS))
def test_eval_sees_every_example_once_and_pads_at_the_end(n: int, m: int, world: int) -> None:
    steps = num_eval_steps(n, world_size=world, micro_batch_size=m)
    got = np.concatenate([eval_micro_batch_indices(k, n=n, rank=r, world_size=world,
                                                   micro_batch_size=m)
                          for k in range(steps) for r in range(world)] or [np.zeros(0, np.int64)])
    real = got[got >= 0]
    assert np.array_equal(real, np.arange(n))
    assert (got[n:] == -1).all() and len(got) - n < m * world


def test_eval_step_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"eval step k must be in \[0, 2\)"):
        eval_micro_batch_indices(2, n=10, rank=0, world_size=2, micro_batch_size=4)


def test_epoch_and_offset() -> None:
    assert epoch_and_offset(0, 10) == (0, 0)
    assert epoch_and_offset(25, 10) == (2, 5)
    e, o = epoch_and_offset(np.array([9, 10, 11]), 10)
    assert e.tolist() == [0, 1, 1] and o.tolist() == [9, 0, 1]
    with pytest.raises(ValueError, match="n \\(examples per epoch\\) must be >= 1"):
        epoch_and_offset(3, 0)


@settings(max_examples=60, deadline=None)
@given(world=st.integers(1, 8), m=st.integers(1, 9), consumed_steps=st.integers(0, 50),
       steps=st.integers(0, 20), data=st.data())
def test_iter_micro_batches_equals_micro_batch_indices(world: int, m: int, consumed_steps: int,
                                                       steps: int, data: st.DataObject
                                                       ) -> None:
    from shardwise.plan import iter_micro_batches

    rank = data.draw(st.integers(0, world - 1))
    consumed = consumed_steps * m * world
    got = list(iter_micro_batches(rank=rank, world_size=world, micro_batch_size=m,
                                  consumed=consumed, steps=steps))
    want = [micro_batch_indices(k, rank=rank, world_size=world, micro_batch_size=m,
                                consumed=consumed).tolist() for k in range(steps)]
    assert got == want
    endless = iter_micro_batches(rank=rank, world_size=world, micro_batch_size=m,
                                 consumed=consumed)
    assert [next(endless) for _ in range(steps)] == want
    with pytest.raises(ValueError, match="rank must be in"):
        next(iter_micro_batches(rank=world, world_size=world, micro_batch_size=m))
