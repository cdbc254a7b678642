"""StreamDataset resume: exact continuation under the same and other world sizes, across
epochs and into single-pass padding; seeking reads no consumed block; foreign states are
refused by field."""

from __future__ import annotations

import json
import random
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import StateError
from shardwise.read.orders.stream_layout import StreamLayout
from shardwise.read.stream.dataset import StreamDataset
from shardwise.read.stream.run import first_example
from shardwise.testing import assert_resumes_exactly

S = 4


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "cache"
    return make_cache(root, [sample_docs(70, seed=5), sample_docs(55, seed=6)], chunk_docs=3)


def reader(cache_dir: Path, world: sw.World, **kw: object) -> StreamDataset:
    opts: dict[str, object] = dict(seq_len=12, streams=S, seed=11, block_chunks=2)
    opts.update(kw)
    return StreamDataset(cache_dir, world=world, **opts)  # type: ignore[arg-type]


def global_rows(cache_dir: Path, n: int, **kw: object) -> np.ndarray:
    return np.stack([e["input_ids"] for e in islice(reader(cache_dir, sw.World(0, 1), **kw),
                                                     n)])


def run_ranks(cache_dir: Path, R: int, state: dict | None, n: int, **kw: object
              ) -> tuple[dict[int, np.ndarray], list[dict]]:
    """Simulate R ranks, each taking up to n examples after ``state``; rows by global index
    and every rank's state afterwards."""
    by_index: dict[int, np.ndarray] = {}
    states = []
    for r in range(R):
        ds = reader(cache_dir, sw.World(r, R), **kw)
        if state is not None:
            ds.load_state_dict(json.loads(json.dumps(state)))
        j0 = first_example(ds.consumed, r, R)
        for j, e in enumerate(islice(ds, n)):
            by_index[(j0 + j) * R + r] = e["input_ids"]
        states.append(ds.state_dict())
    return by_index, states


@pytest.mark.parametrize(("before", "after"), [(1, 1), (2, 2), (4, 4), (1, 4), (4, 2), (2, 1),
                                               (3, 8), (8, 3), (1, 3), (3, 2)])
def test_resume_at_a_random_point_under_the_same_or_another_world_size(
        cache_dir: Path, before: int, after: int) -> None:
    steps = random.Random(f"{before}->{after}").randrange(0, 400)  # up to ~2 epochs
    ref = global_rows(cache_dir, steps * before + 200)
    rows, states = run_ranks(cache_dir, before, None, steps)
    assert all(s == states[0] for s in states), "every rank saves the same state"
    assert states[0]["consumed"] == steps * before
    assert sorted(rows) == list(range(steps * before))
    tail, _ = run_ranks(cache_dir, after, states[0], 120 // after)
    assert sorted(tail) == list(range(steps * before, steps * before + 120))
    for i, row in tail.items():
        assert np.array_equal(row, ref[i]), f"{before} -> {after} ranks: global row {i}"


def test_resume_mid_step_under_a_world_size_that_does_not_divide_it(cache_dir: Path) -> None:
    ref = global_rows(cache_dir, 200)
    rows, states = run_ranks(cache_dir, 2, None, 3)       # consumed = 6, not a multiple of 4
    tail, after = run_ranks(cache_dir, 4, states[0], 20)
    assert min(tail) == 6 and sorted(tail) == list(range(6, 6 + len(tail)))
    assert all(np.array_equal(row, ref[i]) for i, row in tail.items())


@pytest.mark.parametrize("world", [sw.World(1, 2), sw.World(2, 3), sw.World(6, 8)])
def test_resumes_exactly_from_every_step(cache_dir: Path, world: sw.World) -> None:
    assert_resumes_exactly(lambda: reader(cache_dir, world, batch_size=3), steps=14)


def test_single_pass_resume_into_the_padding(cache_dir: Path) -> None:
    full = [e for e in reader(cache_dir, sw.World(0, 2), epochs=1)]
    for k in (0, len(full) // 2, len(full) - 3, len(full)):
        ds = reader(cache_dir, sw.World(0, 2), epochs=1)
        it = iter(ds)
        for _ in range(k):
            next(it)
        again = reader(cache_dir, sw.World(0, 2), epochs=1)
        again.load_state_dict(ds.state_dict())
        tail = list(again)
        assert len(tail) == len(full) - k
        assert all(np.array_equal(a["input_ids"], b["input_ids"])
                   and np.array_equal(a["loss_mask"], b["loss_mask"])
                   for a, b in zip(tail, full[k:], strict=True))


def test_seeking_reads_no_consumed_block(cache_dir: Path) -> None:
    consumed = 333
    ds = reader(cache_dir, sw.World(0, 1))
    state = dict(ds.state_dict(), consumed=consumed)
    state["extra"] = {"stream_examples": [first_example(consumed, s, S) for s in range(S)]}
    ds.load_state_dict(state)
    next(iter(ds))
    assert ds.opened, "the first example's block was read"
    for c in ds.opened:
        s = c % S
        layout = StreamLayout(s, ds.config)
        layout.update(ds.cache)
        where = layout.locate(first_example(consumed, s, S), None)
        assert isinstance(where, tuple)
        assert (c // S) // 2 >= where[1], f"chunk {c} lies in a block before the position"


def test_foreign_states_are_refused_by_field(cache_dir: Path) -> None:
    state = reader(cache_dir, sw.World(0, 1)).state_dict()
    with pytest.raises(StateError, match=r"seed: state has 11, this reader has 12"):
        reader(cache_dir, sw.World(0, 1), seed=12).load_state_dict(state)
    with pytest.raises(StateError, match=r"streams: state has 4"):
        reader(cache_dir, sw.World(0, 1), streams=8).load_state_dict(state)
    with pytest.raises(StateError, match="'torch_loader'"):
        reader(cache_dir, sw.World(0, 1)).load_state_dict(dict(state, kind="torch_loader"))
    bad = dict(state, consumed=8, extra={"stream_examples": [0, 0, 0, 0]})
    with pytest.raises(StateError, match="stream_examples"):
        reader(cache_dir, sw.World(0, 1)).load_state_dict(bad)
    other = make_cache(cache_dir.parent / "other", [sample_docs(70, seed=9)], chunk_docs=3)
    with pytest.raises(StateError, match="cache: state has"):
        StreamDataset(other, seq_len=12, streams=S, seed=11, block_chunks=2,
                      world=sw.World(0, 1)).load_state_dict(state)
    assert set(state["config"]) == {  # identity, not size: a growing cache keeps its states
        "seq_len", "streams", "seed", "block_chunks", "drop_last", "epochs", "cache",
        "order_version", "permutation_version"}


def test_numpy_counts_resume_and_past_the_end_of_a_single_pass_is_refused(
        cache_dir: Path) -> None:
    single = reader(cache_dir, sw.World(0, 2), epochs=1)
    total = 2 * len(list(single))  # both ranks run the same, padded number of steps
    end = single.state_dict()
    assert end["consumed"] == total
    head = reader(cache_dir, sw.World(1, 2), epochs=1)
    state = json.loads(json.dumps(dict(end, consumed=6, extra={
        "stream_examples": [first_example(6, s, S) for s in range(S)]})))
    head.load_state_dict(state)
    want = [e["input_ids"] for e in islice(head, 3)]
    back = reader(cache_dir, sw.World(1, 2), epochs=1)
    back.load_state_dict(dict(state, consumed=np.int64(6), extra={
        "stream_examples": [np.int64(k) for k in state["extra"]["stream_examples"]]}))
    assert all(np.array_equal(a["input_ids"], b) for a, b in zip(islice(back, 3), want,
                                                                  strict=True))
    assert type(back.state_dict()["consumed"]) is int
    again = reader(cache_dir, sw.World(0, 1), epochs=1)
    again.load_state_dict(end)  # the end itself: nothing left
    assert list(again) == []
    past = total + S
    with pytest.raises(StateError, match=f"position is {past:,} examples, past the end"):
        reader(cache_dir, sw.World(0, 1), epochs=1).load_state_dict(dict(end, consumed=past, extra={
            "stream_examples": [first_example(past, s, S) for s in range(S)]}))
    reader(cache_dir, sw.World(0, 1)).load_state_dict(  # endless: any position
        dict(reader(cache_dir, sw.World(0, 1)).state_dict(), consumed=past,
             extra={"stream_examples": [first_example(past, s, S) for s in range(S)]}))
