"""Skip ranges as arithmetic (plan/skips.py) and in the batch sampler (read/sampler.py):
a skip list changes only the skipped steps, for every rank of 1 and 2, single and cyclic;
the position arithmetic agrees with a walk over the steps; bad ranges are refused naming
the fix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.errors import ConfigError
from shardwise.plan.skips import advance, served_segments, skipped_in
from shardwise.read.sampler import BatchSampler, SamplerKind, normalise_skip, skip_from_steps
from shardwise.world import World

STEP = 4


@st.composite
def skips(draw: st.DrawFn, step: int = STEP, steps: int = 40) -> list[tuple[int, int]]:
    """A few ranges of whole steps, unsorted and maybe overlapping."""
    out = []
    for _ in range(draw(st.integers(0, 4))):
        a = draw(st.integers(0, steps - 1))
        out.append((a * step, (a + draw(st.integers(1, 6))) * step))
    return out


def _walk(skip: tuple[tuple[int, int], ...], start: int, end: int) -> list[int]:
    """The served step positions in [start, end), by looking at every step."""
    return [p for p in range(start, end, STEP) if not any(a <= p < b for a, b in skip)]


def test_normalise_sorts_merges_and_names_the_fix() -> None:
    assert normalise_skip([(8, 12), (0, 4), (4, 6), (10, 16)], 2) == ((0, 6), (8, 16))
    assert normalise_skip(None, 2) == ()
    with pytest.raises(ConfigError, match=r"\(3, 8\).*= 2.*use \(2, 8\)"):
        normalise_skip([(3, 8)], 2)
    with pytest.raises(ConfigError, match=r"\(4, 4\).*start < stop"):
        normalise_skip([(4, 4)], 2)
    with pytest.raises(ConfigError, match="integer position"):
        normalise_skip([(0.0, 4)], 2)
    with pytest.raises(ConfigError, match="integer position"):
        normalise_skip([(True, 4)], 2)
    with pytest.raises(ConfigError, match="pair"):
        normalise_skip([(0, 4, 8)], 2)
    assert skip_from_steps([(2, 3)], 16) == ((32, 48),)
    with pytest.raises(ConfigError, match=r"skip_steps range \(3, 3\)"):
        skip_from_steps([(3, 3)], 16)


@settings(max_examples=200, deadline=None)
@given(raw=skips(), start=st.integers(0, 50), k=st.integers(0, 60))
def test_arithmetic_agrees_with_a_walk(raw: list[tuple[int, int]], start: int, k: int) -> None:
    skip, start = normalise_skip(raw, STEP), start * STEP
    served = _walk(skip, start, start + 400 * STEP)
    # after k served steps the position is just past the k-th one (not jumped further)
    assert advance(skip, start, k, STEP) == (start if k == 0 else served[k - 1] + STEP)
    segs = list(served_segments(skip, start, start + 80 * STEP))
    assert [p for lo, hi in segs for p in range(lo, hi or 0, STEP)] == _walk(
        skip, start, start + 80 * STEP)
    assert skipped_in(skip, start, start + 80 * STEP) == 80 * STEP - STEP * len(
        _walk(skip, start, start + 80 * STEP))


@pytest.mark.parametrize("kind", ["single", "cyclic"])
@pytest.mark.parametrize("world_size", [1, 2])
@settings(max_examples=30, deadline=None)
@given(raw=skips(step=8, steps=25), consumed_steps=st.integers(0, 12))
def test_a_skip_list_changes_only_the_skipped_steps(kind: str, world_size: int,
                                                    raw: list[tuple[int, int]],
                                                    consumed_steps: int) -> None:
    """Every rank's micro-batches with skips are those without, minus the skipped steps;
    ``micro_batch(k)`` and ``len()`` agree with iteration; the run ends at the same
    position."""
    m, total = 8 // world_size, 200
    skip = normalise_skip(raw, 8)
    for r in range(world_size):
        plain, skipped = (BatchSampler(97, 16, m, World(r, world_size), SamplerKind.parse(kind),
                                       seed=5, consumed=consumed_steps * 8, total=total, skip=s)
                          for s in ((), skip))
        positions = range(consumed_steps * 8, total - total % 8, 8)
        want = [b for p, b in zip(positions, plain, strict=True)
                if not any(a <= p < e for a, e in skip)]
        got = list(skipped)
        assert got == want
        assert len(skipped) == len(got)
        assert [skipped.micro_batch(k) for k in range(len(got))] == got
        assert skipped.advance(len(got)) <= total


def test_eval_refuses_a_skip_list_and_drops_name_the_skipped_examples() -> None:
    with pytest.raises(ConfigError, match="eval.*skip"):
        BatchSampler(10, 4, 2, World(0, 2), SamplerKind.EVAL, skip=((0, 4),))
    s = BatchSampler(100, 8, 2, World(0, 2), total=98, skip=((8, 16), (96, 120)))
    partial, drop = s.drops()
    assert partial.count == 2  # the run's last partial step, as without skips
    assert drop.count == 8 and drop.of == 98  # (96, 120) lies past the last whole step
    assert "skip list" in drop.reason
    assert s.advance(2) == 8 and s.advance(3) == 20  # the jump comes with the next step
    assert s.skipped(0, 20) == 8


def test_a_reader_that_cannot_skip_refuses_a_skip_list() -> None:
    from shardwise.read.sampler import refuse_skip

    refuse_skip([], "PackedSFT")  # nothing to skip: fine
    with pytest.raises(ConfigError, match=r"PackedSFT cannot skip ranges.*skip_steps=.*"
                                          r"StreamDataset \(skip=\)"):
        refuse_skip([(0, 8)], "PackedSFT")


def test_a_damaged_skip_list_in_a_state_is_a_state_error() -> None:
    from shardwise.checkpoint import LoaderState
    from shardwise.errors import StateError

    st = LoaderState("f0", 16, config={"n": 1, "skip": "bad"})
    with pytest.raises(StateError, match="config.skip must be a list"):
        st.check_matches("loader", "f1", {"n": 1, "skip": [[0, 8]]})
    ok = LoaderState("f0", 16, config={"n": 1, "skip": [[0, 8]]})
    ok.check_matches("loader", "f1", {"n": 1, "skip": [[0, 8], [16, 24]]})  # a future range
    with pytest.raises(StateError, match=r"skip range \[8, 24\)"):
        ok.check_matches("loader", "f1", {"n": 1, "skip": [[0, 8], [8, 24]]})  # [8, 16) was served
