"""Permutation: a keyed bijection of range(n), per index, that is not an affine map."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import PERMUTATION_VERSION, Permutation, derive_seed, permutation
from shardwise.plan.permutation import half_bits, permute_within

SEEDS = st.integers(0, 2**64)
EPOCHS = st.integers(0, 10_000)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5000), seed=SEEDS, epoch=EPOCHS)
def test_bijection_for_every_small_n(n: int, seed: int, epoch: int) -> None:
    out = permutation(n, seed=seed, epoch=epoch)
    assert out.dtype == np.int64 and out.shape == (n,)
    assert np.array_equal(np.sort(out), np.arange(n))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 15, 16, 17, 64, 65, 1023, 1024, 1025])
def test_bijection_at_domain_edges(n: int) -> None:
    p = Permutation(n, seed=3, epoch=1)
    out = p(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))
    assert np.array_equal(p.inverse(out), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 2**62), seed=SEEDS, epoch=EPOCHS, data=st.data())
def test_inverse_round_trips_for_large_n(n: int, seed: int, epoch: int,
                                         data: st.DataObject) -> None:
    idx = np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=64)))
    p = Permutation(n, seed=seed, epoch=epoch)
    out = p(idx)
    assert ((out >= 0) & (out < n)).all()
    assert np.array_equal(p.inverse(out), idx)
    assert np.array_equal(p(p.inverse(idx)), idx)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2**40), seed=SEEDS, data=st.data())
def test_scalar_and_vector_paths_agree(n: int, seed: int, data: st.DataObject) -> None:
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=16))
    p = Permutation(n, seed=seed, epoch=2)
    vec = p(np.asarray(idx))
    assert [p(i) for i in idx] == vec.tolist()
    assert [p.inverse(int(v)) for v in vec] == idx
    assert isinstance(p(idx[0]), int)


def test_docstring_example() -> None:
    assert permutation(5, seed=1, epoch=0).tolist() == [2, 4, 3, 0, 1]


def test_shape_is_preserved() -> None:
    p = Permutation(100, seed=1, epoch=0)
    idx = np.arange(12).reshape(3, 4)
    assert p(idx).shape == (3, 4)
    assert p(np.int64(5)) == p(5)
    assert p(np.zeros(0, np.int64)).shape == (0,)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(10, 10**6), seed=SEEDS, epoch=EPOCHS)
def test_seed_and_epoch_change_the_order(n: int, seed: int, epoch: int) -> None:
    idx = np.arange(min(n, 64))
    base = Permutation(n, seed=seed, epoch=epoch)(idx)
    assert not np.array_equal(base, Permutation(n, seed=seed + 1, epoch=epoch)(idx))
    assert not np.array_equal(base, Permutation(n, seed=seed, epoch=epoch + 1)(idx))


@pytest.mark.parametrize("n", [1000, 4096, 10**6 + 3, 2**40])
def test_not_an_affine_map(n: int) -> None:
    out = Permutation(n, seed=1234, epoch=0)(np.arange(256))
    steps = np.diff(out) % n
    assert len(np.unique(steps)) > 100  # an LCG would have exactly one step


def test_looks_shuffled() -> None:
    out = permutation(10_000, seed=5, epoch=0)
    assert abs(np.corrcoef(np.arange(10_000), out)[0, 1]) < 0.05
    assert (out == np.arange(10_000)).sum() < 10  # about one fixed point expected


def test_domain_is_the_smallest_even_bit_power_of_two() -> None:
    assert [half_bits(n) for n in (1, 2, 4, 5, 16, 17, 2**40, 2**40 + 1, 2**62)] == \
        [1, 1, 1, 2, 2, 3, 20, 21, 31]


def test_version_constant() -> None:
    assert PERMUTATION_VERSION == 1


def test_a_million_indices_in_one_call_are_distinct_and_in_range() -> None:
    """The vectorised path at its worst case (a domain of 4n, so cycle walking); its speed
    is ``shardwise bench read``'s to measure, not a timed test's."""
    n = 2**40 + 1
    out = Permutation(n, seed=9, epoch=0)(np.arange(10**6))
    assert out.shape == (10**6,) and out.min() >= 0 and out.max() < n
    assert np.unique(out).size == 10**6


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n": -1, "seed": 0, "epoch": 0}, "n must be >= 0"),
    ({"n": 2**62 + 1, "seed": 0, "epoch": 0}, "n must be <= "),
    ({"n": 10, "seed": 0, "epoch": -1}, "epoch must be >= 0"),
    ({"n": 10, "seed": 1.5, "epoch": 0}, "seed must be an integer"),
])
def test_bad_arguments_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Permutation(**kwargs)  # type: ignore[arg-type]


def test_out_of_range_index_is_refused() -> None:
    p = Permutation(10, seed=0, epoch=0)
    with pytest.raises(ValueError, match=r"in \[0, 10\), got 10"):
        p(10)
    with pytest.raises(ValueError, match="got -1"):
        p.inverse(np.array([0, -1]))
    with pytest.raises(ValueError, match="no valid indices"):
        Permutation(0, seed=0, epoch=0)(0)
    with pytest.raises(ValueError, match="must be integers"):
        p(np.array([1.0]))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8), seed=SEEDS)
def test_permute_within_permutes_each_group(sizes: list[int], seed: int) -> None:
    groups = np.repeat(np.arange(len(sizes)), sizes)
    size = np.repeat(sizes, sizes)
    idx = np.concatenate([np.arange(s) for s in sizes])
    out = permute_within(idx, size, groups, seed=seed, epoch=0, tag="t")
    for g, s in enumerate(sizes):
        assert np.array_equal(np.sort(out[groups == g]), np.arange(s))


def test_permute_within_groups_and_tags_are_independent() -> None:
    idx = np.tile(np.arange(50), 2)
    out = permute_within(idx, 50, np.repeat([0, 1], 50), seed=1, epoch=0, tag="a")
    assert not np.array_equal(out[:50], out[50:])
    other = permute_within(idx, 50, np.repeat([0, 1], 50), seed=1, epoch=0, tag="b")
    assert not np.array_equal(out, other)


def test_derive_seed_is_stable_and_separates_tags() -> None:
    assert derive_seed(1234, "doc_shuffle") == derive_seed(1234, "doc_shuffle")
    assert derive_seed(1234, "doc_shuffle") != derive_seed(1234, "cyclic_bucket", 0)
    assert 0 <= derive_seed(-5, "x") < 2**63
