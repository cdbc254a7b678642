"""Blend: every prefix within one example of the weights; slices equal the full index."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.plan import BlendSchedule, blend_index, blend_slice, normalize_weights
from shardwise.plan.blend import CHECKPOINT_EVERY, StagedBlend

WEIGHTS = st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1.0)), min_size=1, max_size=7).filter(
    lambda w: sum(w) > 0)


def realised_counts(sources: np.ndarray, k: int) -> np.ndarray:
    return np.cumsum(np.eye(k, dtype=np.int64)[sources], axis=0)


@settings(max_examples=80, deadline=None)
@given(weights=WEIGHTS, n=st.integers(0, 3000))
def test_every_prefix_is_within_one_example(weights: list[float], n: int) -> None:
    w = normalize_weights(weights)
    sources, offsets = blend_index(n, weights)
    assert sources.shape == offsets.shape == (n,)
    counts = realised_counts(sources, len(w))
    prefix = np.arange(1, n + 1)[:, None]
    assert (np.abs(counts - w * prefix) <= 1 + 1e-9).all()
    assert (w[sources] > 0).all()  # a zero weight never appears
    before = counts - np.eye(len(w), dtype=np.int64)[sources]
    assert np.array_equal(offsets, before[np.arange(n), sources])


@settings(max_examples=80, deadline=None)
@given(weights=WEIGHTS)
def test_small_weights_never_round_to_zero(weights: list[float]) -> None:
    w = normalize_weights(weights)
    horizon = int(math.ceil(1 / w[w > 0].min()))
    sources, _ = blend_index(min(horizon, 20_000), weights)
    for j in np.flatnonzero(w > 0):
        first = np.flatnonzero(sources == j)
        if math.ceil(1 / w[j]) <= len(sources):
            assert first.size and first[0] < math.ceil(1 / w[j])


@settings(max_examples=40, deadline=None)
@given(weights=WEIGHTS, start=st.integers(0, 2000), length=st.integers(0, 500))
def test_slice_equals_the_full_index(weights: list[float], start: int, length: int) -> None:
    full_s, full_o = blend_index(start + length, weights)
    s, o = blend_slice(start, start + length, weights)
    assert np.array_equal(s, full_s[start:]) and np.array_equal(o, full_o[start:])


def test_across_checkpoints_and_random_access() -> None:
    weights = [0.6, 0.25, 0.1, 0.05]
    stop = CHECKPOINT_EVERY + 5000
    full_s, full_o = blend_index(stop, weights)
    schedule = BlendSchedule(weights)
    s, o = schedule.slice(CHECKPOINT_EVERY - 100, stop)
    assert np.array_equal(s, full_s[-5100:]) and np.array_equal(o, full_o[-5100:])
    idx = np.array([[3, CHECKPOINT_EVERY + 17], [CHECKPOINT_EVERY - 1, 0]])
    src, off = schedule(idx)
    assert np.array_equal(src, full_s[idx]) and np.array_equal(off, full_o[idx])
    assert np.array_equal(schedule.counts_at(stop), np.bincount(full_s, minlength=4))
    assert np.array_equal(schedule.counts_at(CHECKPOINT_EVERY),
                          np.bincount(full_s[:CHECKPOINT_EVERY], minlength=4))


def test_docstring_example() -> None:
    sources, offsets = blend_index(10, [0.5, 0.3, 0.2])
    assert sources.tolist() == [0, 1, 0, 2, 0, 1, 0, 2, 1, 0]
    assert offsets.tolist() == [0, 0, 1, 0, 2, 1, 3, 1, 2, 4]


def test_single_source_and_weights_need_not_sum_to_one() -> None:
    assert blend_index(5, [0, 3.0])[0].tolist() == [1] * 5
    assert np.array_equal(blend_index(50, [2, 1])[0], blend_index(50, [2 / 3, 1 / 3])[0])


@pytest.mark.parametrize(("weights", "match"), [
    ([], "non-empty"),
    ([0.5, -0.1], "finite and >= 0"),
    ([0.0, 0.0], "at least one weight must be > 0"),
    ([float("nan"), 1.0], "finite"),
])
def test_bad_weights_are_refused(weights: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        blend_index(10, weights)


def test_seeding_from_saved_counts_resumes_in_one_block() -> None:
    """A checkpoint's counts let a fresh schedule continue at t without computing [0, t)."""
    w = [0.5, 0.3, 0.15, 0.05]
    full = BlendSchedule(w)
    src, off = full.slice(0, 300_000)
    for t in (0, 1, 65_535, 65_536, 123_457, 250_000):
        fresh = BlendSchedule(w)
        fresh.seed(t, full.counts_at(t))
        s, o = fresh.slice(t, t + 20_000)
        assert (s == src[t: t + 20_000]).all() and (o == off[t: t + 20_000]).all()
        assert min(fresh._known) == 0 and max(k for k in fresh._known if k <= t) == t
    deep = BlendSchedule(w)
    t = 10**12 + 12_345
    exact = np.asarray(w) * t
    counts = np.floor(exact).astype(np.int64)
    for j in np.argsort(counts - exact)[: t - counts.sum()]:  # largest remainders
        counts[j] += 1
    deep.seed(t, counts)  # would take days to compute from 0
    s, _ = deep.slice(t, t + 1000)
    assert len(s) == 1000
    with pytest.raises(ValueError, match="cannot follow"):
        BlendSchedule(w).seed(100, [100, 0, 0, 0])


# -- stages ------------------------------------------------------------------------------
STAGES = st.lists(st.tuples(st.integers(1, 400), WEIGHTS), min_size=1, max_size=4)


def staged_from(spec: list[tuple[int, list[float]]], k: int) -> StagedBlend:
    """Stages of ``k`` sources: each spec entry is (length, weights padded/cut to k)."""
    starts = np.cumsum([0] + [n for n, _ in spec[:-1]]).tolist()
    weights = [(w + [0.0] * k)[:k] if sum((w + [0.0] * k)[:k]) > 0 else [1.0] * k
               for _, w in spec]
    return StagedBlend(list(zip(starts, weights, strict=True)))


@settings(max_examples=60, deadline=None)
@given(spec=STAGES, k=st.integers(1, 5), tail=st.integers(0, 300))
def test_stages_each_keep_their_own_guarantee_and_offsets_continue(
        spec: list[tuple[int, list[float]]], k: int, tail: int) -> None:
    plan = staged_from(spec, k)
    n = plan.starts[-1] + tail
    sources, offsets = plan.slice(0, n)
    counts = realised_counts(sources, k)
    for j, start in enumerate(plan.starts):  # counted from the stage's start
        stop = plan.starts[j + 1] if j + 1 < len(plan.starts) else n
        if stop <= start:
            continue
        w = plan.stages[j].weights
        before = counts[start - 1] if start else np.zeros(k, np.int64)
        rel = counts[start:stop] - before
        assert (np.abs(rel - w * np.arange(1, stop - start + 1)[:, None]) <= 1 + 1e-9).all()
        assert (w[sources[start:stop]] > 0).all()
    # each source's offsets run 0, 1, 2, ... across every boundary: no repeat, no skip
    for j in range(k):
        assert offsets[sources == j].tolist() == list(range(int((sources == j).sum())))
    for t in range(n + 1):  # counts_at is brute-force counting
        want = counts[t - 1] if t else np.zeros(k, np.int64)
        assert np.array_equal(plan.counts_at(t), want)
    idx = np.random.default_rng(n).integers(0, max(n, 1), size=(3, 7))
    if n:
        s, o = staged_from(spec, k)(idx)  # random access on a fresh plan
        assert np.array_equal(s, sources[idx]) and np.array_equal(o, offsets[idx])


def test_one_stage_is_the_plain_rule_and_the_docstring_example() -> None:
    w = [0.6, 0.25, 0.1, 0.05]
    s, o = StagedBlend([(0, w)]).slice(0, 5000)
    full_s, full_o = blend_index(5000, w)
    assert np.array_equal(s, full_s) and np.array_equal(o, full_o)
    plan = StagedBlend([(0, [0.5, 0.5]), (4, [0, 1]), (6, [0.5, 0.5])])
    s, o = plan.slice(0, 9)
    assert s.tolist() == [0, 1, 0, 1, 1, 1, 0, 1, 0]
    assert o.tolist() == [0, 0, 1, 1, 2, 3, 2, 4, 3]
    assert plan.counts_at(4).tolist() == [2, 2] and plan.counts_at(6).tolist() == [2, 4]


def test_seeding_a_stage_continues_across_the_next_boundary_without_replay() -> None:
    stages = [(0, [0.7, 0.3, 0]), (CHECKPOINT_EVERY + 10, [0.4, 0.3, 0.3]),
              (CHECKPOINT_EVERY + 900, [0, 0, 1])]
    full = StagedBlend(stages)
    src, off = full.slice(0, CHECKPOINT_EVERY + 2500)
    for t in (CHECKPOINT_EVERY + 10, CHECKPOINT_EVERY + 11, CHECKPOINT_EVERY + 899):
        fresh = StagedBlend(stages)
        k = fresh.stage_of(t)
        fresh.seed(t, full.counts_at(t), full.base(k))
        s, o = fresh.slice(t, t + 1500)
        assert (s == src[t: t + 1500]).all() and (o == off[t: t + 1500]).all()
        assert set(fresh.stages[0]._known) == {0}  # stage 0 was never computed
    with pytest.raises(ValueError, match="counts at that stage's start are needed"):
        StagedBlend(stages).seed(CHECKPOINT_EVERY + 20, full.counts_at(CHECKPOINT_EVERY + 20),
                                 None)
    known = StagedBlend(stages)
    known.counts_at(CHECKPOINT_EVERY + 10)  # the stage's start is known: a forged one is not
    forged = full.base(1) + np.asarray([1, -1, 0])
    with pytest.raises(ValueError, match="differ from this blend's"):
        known.seed(CHECKPOINT_EVERY + 20, full.counts_at(CHECKPOINT_EVERY + 20), forged)
    with pytest.raises(ValueError, match="cannot precede"):
        StagedBlend(stages).seed(CHECKPOINT_EVERY + 20, full.counts_at(CHECKPOINT_EVERY + 20),
                                 [0, 0, 0])


@pytest.mark.parametrize(("stages", "match"), [
    ([], "at least one stage"),
    ([(5, [1, 1])], "begin at 0 and increase"),
    ([(0, [1, 1]), (0, [1, 2])], "begin at 0 and increase"),
    ([(0, [1, 1]), (9, [1, 2, 3])], "one weight per source"),
    ([(0, [1, 1]), (9, [0, 0])], "at least one weight"),
])
def test_bad_stages_are_refused(stages: list[tuple[int, list[float]]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StagedBlend(stages)
