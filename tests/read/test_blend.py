"""Blend: rows are the sources' own examples, every prefix within one example of the
weights, the same global order for every world size, exact resume (map-style through the
torch loader, and iterating streams), the consumption report, refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import ConfigError, StateError
from shardwise.read.compose.blend import Blend
from shardwise.read.compose.sft_pack import PackedSFT
from shardwise.testing import assert_resumes_exactly, assert_same_global_order, take
from shardwise.torch import loader

SPLIT = 500  # source "a" uses ids below it, source "b" ids from it: a row names its source


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("blend")
    a = make_cache(root / "a", [sample_docs(50, seed=1, vocab_size=SPLIT)], chunk_docs=7)
    b_docs = [[t + SPLIT for t in d] for d in sample_docs(40, seed=2, vocab_size=SPLIT)]
    b = make_cache(root / "b", [b_docs], chunk_docs=5)
    return a, b


def datasets(caches: tuple[Path, Path], **opts: Any) -> list[sw.TokenDataset]:
    return [sw.TokenDataset(caches[0], seq_len=16, seed=1, **opts),
            sw.TokenDataset(caches[1], seq_len=16, seed=2, **opts)]


def source_of(rows: np.ndarray) -> np.ndarray:
    return (rows >= SPLIT).any(axis=1).astype(np.int64)


def assert_within_one(sources: np.ndarray, weights: list[float]) -> None:
    w = np.asarray(weights) / sum(weights)
    counts = np.cumsum(np.eye(len(w), dtype=np.int64)[sources], axis=0)
    t = np.arange(1, len(sources) + 1)[:, None]
    assert (np.abs(counts - w * t) <= 1 + 1e-9).all()


def test_rows_are_the_sources_own_examples(caches: tuple[Path, Path]) -> None:
    ds = datasets(caches, cu_seqlens=True, reset_position_ids=True)
    mix = Blend(ds, [0.7, 0.3], names=["a", "b"])
    idx = list(range(0, 3 * len(mix), 7))  # past len(): sources go on into later epochs
    batch = mix.__getitems__(idx)
    src, off = mix.place(idx)
    L = 16
    for row, (j, o) in enumerate(zip(src.tolist(), off.tolist(), strict=True)):
        own = ds[j][o]
        for key in ("input_ids", "labels", "loss_mask", "position_ids"):
            assert (batch[key][row] == own[key]).all()
        cu = batch["cu_seqlens"]
        inner = cu[(cu > row * L) & (cu < (row + 1) * L)] - row * L
        own_cu = own["cu_seqlens"]
        assert inner.tolist() == own_cu[(own_cu > 0) & (own_cu < L)].tolist()
    assert batch["cu_seqlens"][-1] == len(idx) * L
    one = mix[idx[3]]
    assert all((one[k] == batch[k][3]).all() for k in ("input_ids", "labels"))
    padded = mix.__getitems__([sw.PAD, 0])
    assert padded["loss_mask"][0].sum() == 0 and (padded["input_ids"][1] == batch[
        "input_ids"][0]).all()


def test_every_prefix_within_one_example_through_the_loader(caches: tuple[Path, Path]
                                                            ) -> None:
    mix = Blend(datasets(caches), [0.8, 0.2])
    dl = loader(mix, global_batch_size=8, micro_batch_size=4, world=sw.World(0, 1))
    rows = np.concatenate([b["input_ids"].numpy() for b in take(dl, 60)])
    assert_within_one(source_of(rows), [0.8, 0.2])
    report = mix.report(dl.consumed)
    counts = [s["count"] for s in report["sources"]]
    assert counts == np.bincount(source_of(rows), minlength=2).tolist()
    assert report["consumed"] == 240 and report["max_deviation"] <= 1


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.97, 0.02, 0.01], [1, 0, 3]])
def test_small_weights_never_round_to_zero(caches: tuple[Path, Path], weights: list[float]
                                           ) -> None:
    ds = datasets(caches)
    mix = Blend([ds[0], ds[1], ds[0]], weights, seed=5)
    src, _ = mix.place(np.arange(400))
    assert_within_one(src, weights)
    w = np.asarray(weights) / sum(weights)
    for j in np.flatnonzero(w > 0):
        assert np.flatnonzero(src == j)[0] < math.ceil(1 / w[j])
    assert not (src == np.flatnonzero(w == 0)[:, None]).any()


def test_seed_changes_the_interleaving_not_the_guarantee(caches: tuple[Path, Path]) -> None:
    ds = datasets(caches)
    orders = {tuple(Blend(ds, [0.5, 0.5], seed=s).place(np.arange(20))[0].tolist())
              for s in range(8)}
    assert len(orders) == 2  # with two equal weights: abab... or baba...
    assert (Blend(ds, [0.6, 0.4], seed=3).place(np.arange(50))[0]
            == Blend(ds, [0.6, 0.4], seed=3).place(np.arange(50))[0]).all()


def test_same_global_order_for_every_world_size(caches: tuple[Path, Path]) -> None:
    mix = Blend(datasets(caches), [0.7, 0.3], seed=3)
    assert_same_global_order(
        lambda w: loader(mix, global_batch_size=8, micro_batch_size=2, world=w),
        world_sizes=[1, 2, 4], steps=16)


def test_resumes_exactly_through_the_loader(caches: tuple[Path, Path]) -> None:
    mix = Blend(datasets(caches), [0.7, 0.3], seed=3)
    assert_resumes_exactly(
        lambda: loader(mix, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1)),
        steps=16)
    assert_resumes_exactly(  # restored into a loader with worker processes
        lambda: loader(mix, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1)),
        steps=8, stop_points=[3], make_resumed=lambda: loader(
            mix, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1),
            num_workers=2))
    dl = loader(mix, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))
    take(dl, 3)
    state = json.loads(json.dumps(dl.state_dict()))
    assert state["config"]["weights"] == [0.7, 0.3] and "source.source0" in state["config"]
    other = Blend(datasets(caches), [0.6, 0.4], seed=3)
    with pytest.raises(StateError, match="weights"):
        loader(other, global_batch_size=4, micro_batch_size=2,
               world=sw.World(0, 1)).load_state_dict(state)
    reseeded = Blend([datasets(caches)[0], sw.TokenDataset(caches[1], seq_len=16, seed=9)],
                     [0.7, 0.3], seed=3)
    with pytest.raises(StateError, match="source.source1"):
        loader(reseeded, global_batch_size=4, micro_batch_size=2,
               world=sw.World(0, 1)).load_state_dict(state)


class Stream:
    """A minimal stateful stream: ids ``base, base + 1, ...`` (``n`` of them, or forever)."""

    def __init__(self, base: int, n: int | None = None) -> None:
        self.base, self.n, self.pos = base, n, 0

    def __iter__(self) -> Any:
        while self.n is None or self.pos < self.n:
            self.pos += 1
            yield {"input_ids": np.asarray([self.base + self.pos - 1])}

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


def packed_records(n: int, base: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(base)
    return [{"input_ids": np.arange(k) + base + 100 * r}
            for r, k in enumerate(rng.integers(1, 12, size=n).tolist())]


def test_iterable_blend_resumes_exactly(caches: tuple[Path, Path]) -> None:
    recs = packed_records(40, 10_000)

    def make() -> Blend:
        return Blend([Stream(1_000_000), PackedSFT(recs, seq_len=16, group_size=8, epochs=None),
                      datasets(caches)[1]], [0.5, 0.3, 0.2], names=["s", "sft", "tok"])

    assert_resumes_exactly(make, steps=40, stop_points=[0, 1, 7, 20, 39])
    mix = make()
    got = take(mix, 50)
    stream_ids = [int(e["input_ids"][0]) for e in got if e["input_ids"].shape == (1,)]
    assert stream_ids == list(range(1_000_000, 1_000_000 + len(stream_ids)))  # in order
    report = mix.report()
    assert report["consumed"] == 50 and [s["count"] for s in report["sources"]] == [25, 15, 10]
    assert [s["realised"] for s in report["sources"]] == [0.5, 0.3, 0.2]
    state = mix.state_dict()
    assert state["extra"]["counts"] == [25, 15, 10]
    assert state["extra"]["sources"][0] == {"pos": 25} and state["extra"]["sources"][2] is None
    forged = json.loads(json.dumps(state))
    forged["extra"]["counts"] = [30, 10, 10]  # no blend with these weights gets there
    with pytest.raises(StateError, match="do not fit this blend"):
        make().load_state_dict(forged)
    with pytest.raises(TypeError, match="no len"):
        len(mix)
    with pytest.raises(TypeError, match="iterate it"):
        mix.__getitems__([0])


def test_a_finished_stream_ends_the_blend() -> None:
    mix = Blend([Stream(0, n=5), Stream(100)], [0.5, 0.5], names=["short", "long"])
    got = list(mix)
    assert mix.exhausted == "short" and sum(int(e["input_ids"][0]) < 100 for e in got) == 5


def test_refusals(caches: tuple[Path, Path]) -> None:
    ds = datasets(caches)
    for weights, match in (([0.5, -0.5], ">= 0"), ([0, 0], "at least one weight"),
                           ([1.0], "one weight per dataset"), ([math.nan, 1], "finite")):
        with pytest.raises(ConfigError, match=match):
            Blend(ds, weights)
    with pytest.raises(ConfigError, match="distinct"):
        Blend(ds, [1, 1], names=["x", "x"])
    with pytest.raises(ConfigError, match="neither map-style"):
        Blend([ds[0], object()], [1, 1])
    other_len = sw.TokenDataset(caches[1], seq_len=8)
    with pytest.raises(ConfigError, match="different examples"):
        Blend([ds[0], other_len], [1, 1]).__getitems__(list(range(4)))


def test_a_blend_names_what_its_sources_drop_and_pads_like_its_first(
        caches: tuple[Path, Path]) -> None:
    a, b = datasets(caches)
    mix = Blend([a, b], [0.6, 0.4], names=["web", "code"])
    want = [(d.count, d.unit) for d in a.drops() + b.drops()]
    assert [(d.count, d.unit) for d in mix.drops()] == want and want
    assert "web: after the last full window" in repr(mix)
    assert mix.pads and not Blend([list(range(5)), a], [1, 1]).pads
    dl = loader(mix, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 2))
    assert [x["count"] for x in dl.describe()["drops"]] == [c for c, _ in want]
    state = dl.state_dict()
    state["extra"]["blend_counts"] = [np.int64(c) for c in state["extra"]["blend_counts"]]
    dl.load_state_dict(state)
    state["extra"]["blend_counts"] = [0.0, 0.0]
    with pytest.raises(StateError, match=r"blend counts\[0\] must be an integer"):
        dl.load_state_dict(state)


# -- schedules ---------------------------------------------------------------------------
SCHEDULE = [(0, {"a": 0.8, "b": 0.2}), (22, {"b": 1.0}), (30, {"a": 0.3, "b": 0.7})]


def scheduled(caches: tuple[Path, Path], schedule: Any = SCHEDULE) -> Blend:
    return Blend(datasets(caches), names=["a", "b"], seed=3, schedule=schedule)


def test_a_schedule_holds_each_stage_and_continues_each_source(caches: tuple[Path, Path]
                                                                ) -> None:
    mix = scheduled(caches)
    dl = loader(mix, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))
    rows = np.concatenate([b["input_ids"].numpy() for b in take(dl, 40)])  # 80 examples
    src = source_of(rows)
    assert_within_one(src[:22], [0.8, 0.2])
    assert (src[22:30] == 1).all()
    assert_within_one(src[30:], [0.3, 0.7])  # counted from the stage's start
    ds = datasets(caches)
    s, off = mix.place(np.arange(80))
    for j in (0, 1):  # every source goes on with its next example at each boundary
        assert off[s == j].tolist() == list(range(int((s == j).sum())))
        own = np.stack([ds[j][o]["input_ids"] for o in off[s == j].tolist()])
        assert (rows[s == j] == own).all()
    for t in range(81):  # counts_at and tokens_seen are brute-force counting
        want = np.bincount(src[:t], minlength=2)
        assert mix.counts_at(t).tolist() == want.tolist()
        assert mix.tokens_seen(t) == {"a": int(want[0]) * 16, "b": int(want[1]) * 16}
    report = mix.report(26)
    assert report["stage"] == 1 and report["stage_start"] == 22
    assert [r["weight"] for r in report["sources"]] == [0.0, 1.0]
    assert report["max_deviation"] == 0


def test_a_schedule_resumes_exactly_around_every_boundary(caches: tuple[Path, Path]
                                                          ) -> None:
    mix = scheduled(caches)
    for b in (2, 4):  # boundaries inside a step (22 = 5.5 × 4) and on one (30 = 15 × 2)
        assert_resumes_exactly(
            lambda b=b: loader(mix, global_batch_size=b, micro_batch_size=2,
                               world=sw.World(0, 1)), steps=64 // b)
        assert_resumes_exactly(  # a fresh blend per restore: no schedule computed before
            lambda b=b: loader(scheduled(caches), global_batch_size=b, micro_batch_size=2,
                               world=sw.World(0, 1)), steps=48 // b,
            stop_points=[20 // b, 22 // b, 24 // b, 30 // b, 32 // b])
    recs = packed_records(40, 10_000)

    def streams() -> Blend:
        return Blend([Stream(1_000_000), PackedSFT(recs, seq_len=16, group_size=8, epochs=None)],
                     schedule=[(0, [0.5, 0.5]), (9, [0.1, 0.9]), (15, [1, 0])])

    assert_resumes_exactly(streams, steps=30)
    state = streams().state_dict()
    assert "stage_counts" in state["extra"] and "schedule" in state["config"]


def test_the_schedule_after_the_saved_position_may_change(caches: tuple[Path, Path]) -> None:
    def make(schedule: Any) -> Any:
        return loader(scheduled(caches, schedule), global_batch_size=4, micro_batch_size=2,
                      world=sw.World(0, 1))

    first = make(SCHEDULE)
    take(first, 12)  # micro-batches of 2: 24 examples, inside the stage from 22
    state = json.loads(json.dumps(first.state_dict()))
    later = SCHEDULE[:2] + [(40, {"a": 0.5, "b": 0.5}), (60, {"a": 1.0})]
    resumed = make(later)
    resumed.load_state_dict(state)
    want = [b["input_ids"].numpy() for b in take(make(later), 40)[12:]]
    assert all((g["input_ids"].numpy() == w).all()
               for g, w in zip(take(resumed, 28), want, strict=True))
    for changed, start in ((SCHEDULE[:1] + [(21, {"b": 1.0})] + SCHEDULE[2:], 21),
                           (SCHEDULE[:1] + [(22, {"a": 0.1, "b": 0.9})] + SCHEDULE[2:], 22)):
        with pytest.raises(StateError, match=f"schedule: the entry from example {start} "):
            make(changed).load_state_dict(state)
    single = loader(Blend(datasets(caches), [0.8, 0.2], names=["a", "b"], seed=3),
                    global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1))
    take(single, 5)  # 10 examples; a run without a schedule adds one for later
    plain = json.loads(json.dumps(single.state_dict()))
    grown = make(SCHEDULE)
    grown.load_state_dict(plain)
    assert (take(grown, 1)[0]["input_ids"].numpy() == take(make(SCHEDULE), 6)[5][
        "input_ids"].numpy()).all()
    with pytest.raises(StateError, match="schedule: the entry from example 22"):
        take(single, 7)  # 24 examples: past the new stage's start
        make(SCHEDULE).load_state_dict(json.loads(json.dumps(single.state_dict())))


def test_schedule_refusals(caches: tuple[Path, Path]) -> None:
    ds = datasets(caches)
    for kwargs, match in (
            ({"schedule": [(5, [1, 1])]}, "first stage starts at 0"),
            ({"schedule": [(0, [1, 1]), (0, [1, 2])]}, "starts increase"),
            ({"schedule": [(0, {"a": 1, "web": 1})]}, r"name \['web'\]"),
            ({"schedule": [(0, [1, 1]), (4, [1])]}, "stage 1: give one weight per dataset"),
            ({"schedule": [(0, [1, 1]), (4, [0, 0])]}, "stage 1: at least one weight"),
            ({"schedule": [(0, [1, 1])], "weights": [1, 2]}, "differ from the schedule"),
            ({}, "weights=.* or schedule="),
            ({"schedule": "0:1,1"}, "non-empty list")):
        with pytest.raises(ConfigError, match=match):
            Blend(ds, names=["a", "b"], **kwargs)
    same = Blend(ds, [4, 1], names=["a", "b"], schedule=[(0, {"a": 0.8, "b": 0.2})])
    assert "schedule" not in same.state_config()  # one stage: today's config and order
    assert same.state_config() == Blend(ds, [0.8, 0.2], names=["a", "b"]).state_config()
