"""StreamDataset skip ranges: each rank serves exactly its examples without skips minus
the skipped positions (1 and 2 ranks, and 3 ranks sharing 4 streams); no block only a
skipped range holds is read; a resume may add a future range (exactly) but not change a
past one; ``bind`` serves another world before the first read."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.errors import ConfigError, StateError
from shardwise.plan.stream import block_read_order, global_to_stream
from shardwise.read.config import ReadConfig
from shardwise.read.orders.stream_layout import StreamLayout, longest_stream_windows
from shardwise.read.stream.dataset import StreamDataset

S, BS = 4, 2
SKIP = ((12, 36), (48, 60))  # whole steps of batch_size × R for R = 1, 2 and 3


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("skip") / "cache"
    return make_cache(root, [sample_docs(70, seed=5), sample_docs(55, seed=6)], chunk_docs=3)


def reader(cache_dir: Path, world: sw.World, **kw: Any) -> StreamDataset:
    opts: dict[str, Any] = dict(seq_len=12, streams=S, seed=11, block_chunks=2,
                                batch_size=BS)
    opts.update(kw)
    return StreamDataset(cache_dir, world=world, **opts)


def rows(ds: StreamDataset, batches: int | None = None) -> list[np.ndarray]:
    """This rank's examples (input_ids rows) over ``batches`` micro-batches (None: all)."""
    return [row for b in islice(ds, batches) for row in b["input_ids"]]


def skipped(p: int, skip: tuple[tuple[int, int], ...]) -> bool:
    return any(a <= p < b for a, b in skip)


@pytest.mark.parametrize("R", [1, 2, 3])
def test_each_rank_serves_its_examples_less_the_skipped_positions(cache_dir: Path,
                                                                    R: int) -> None:
    states = []
    for r in range(R):
        ref = rows(reader(cache_dir, sw.World(r, R)), 40)  # global j·R + r, j = 0‥79
        want = [row for j, row in enumerate(ref) if not skipped(j * R + r, SKIP)]
        ds = reader(cache_dir, sw.World(r, R), skip=SKIP)
        got = rows(ds, len(want) // BS)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        states.append(ds.state_dict())
    assert all(s == states[0] for s in states), "every rank saves the same state"
    p, served = 0, 0  # consumed: the position after the last served example
    while served < len(want) * R:
        served, p = served + (not skipped(p, SKIP)), p + 1
    assert states[0]["consumed"] == p
    assert states[0]["config"]["skip"] == [list(x) for x in SKIP]


def _blocks_of(ds: StreamDataset, positions: list[int]) -> set[int]:
    """The chunks of every block holding one of ``positions`` (of a single pass)."""
    cfg, cache = ds.config, ds.cache
    pad_to = longest_stream_windows(cache.cum_tokens, cfg)
    layouts = {s: StreamLayout(s, cfg) for s in range(S)}
    out: set[int] = set()
    for p in positions:
        s, k = global_to_stream(p, S)
        layouts[s].update(cache)
        where = layouts[s].locate(k, pad_to)
        if isinstance(where, tuple):
            e, b, _ = where
            out |= set(block_read_order(s, b, layouts[s].block_size(b), n_streams=S,
                                        block_chunks=cfg.block_chunks, seed=cfg.seed,
                                        epoch=e).tolist())
    return out


@pytest.mark.parametrize("R", [1, 2])
def test_no_block_that_only_a_skipped_range_holds_is_read(cache_dir: Path, R: int) -> None:
    """The read-ahead stops at a range and restarts at its end: a single pass read to its
    end opens exactly the blocks of the examples it serves."""
    full = reader(cache_dir, sw.World(0, 1), epochs=1)
    end = S * longest_stream_windows(full.cache.cum_tokens, full.config)
    skip = ((24, end // 2 - end // 2 % 24), (end - end % 24 - 48, end - end % 24 - 24))
    for r in range(R):
        # reading far ahead, so a read-ahead that ran into a skipped range would show
        ds = reader(cache_dir, sw.World(r, R), epochs=1, skip=skip, prefetch_chunks=64)
        n = len(rows(ds))
        served = [p for p in range(r, end, R) if not skipped(p, skip)]
        assert n == len(served)
        assert set(ds.opened) == _blocks_of(ds, served)
        assert set(ds.opened) < _blocks_of(ds, list(range(r, end, R)))
    (drop,) = [d for d in ds.drops() if "skip list" in d.reason]
    assert drop.count == sum(b - a for a, b in skip) and drop.of == end


def _run(cache_dir: Path, R: int, state: dict[str, Any] | None, batches: int,
         **kw: Any) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
    """R ranks from ``state``: rows by global position, and the (common) state after."""
    out, states = {}, []
    for r in range(R):
        ds = reader(cache_dir, sw.World(r, R), **kw)
        if state is not None:
            ds.load_state_dict(json.loads(json.dumps(state)))
        j = -(-(ds.consumed - r) // R)
        for row in rows(ds, batches):
            while skipped(j * R + r, ds.skip):
                j += 1
            out[j * R + r] = row
            j += 1
        states.append(ds.state_dict())
    assert all(s == states[0] for s in states)
    return out, states[0]


@pytest.mark.parametrize(("before", "after"), [(1, 1), (2, 2), (2, 3), (3, 2), (1, 4)])
def test_a_resume_with_a_new_future_range_continues_exactly(cache_dir: Path, before: int,
                                                            after: int) -> None:
    """Also where the saved position is not a whole step of the new world (3 -> 2, 1 -> 4
    ranks): the ranks still serve the order's next examples in step."""
    ref, _ = _run(cache_dir, 1, None, 60)
    _, st = _run(cache_dir, before, None, 3)
    c, step = st["consumed"], BS * after
    assert c == 6 * before and "skip" not in st["config"]
    base = -(-c // step) * step
    new = ((base + 2 * step, base + 4 * step),)  # after the saved position
    tail, st2 = _run(cache_dir, after, st, 8, skip=new)
    want = [p for p in range(c, 120) if not skipped(p, new)][: 8 * step]
    assert sorted(tail) == want
    assert all(np.array_equal(row, ref[p]) for p, row in tail.items())
    assert st2["config"]["skip"] == [list(x) for x in new]
    assert st2["consumed"] == want[-1] + 1


def test_a_new_range_at_the_saved_position_continues_at_its_end(cache_dir: Path) -> None:
    ref, _ = _run(cache_dir, 1, None, 30)
    _, st = _run(cache_dir, 2, None, 3)
    at, st2 = _run(cache_dir, 2, st, 2, skip=((12, 20),))
    assert sorted(at) == list(range(20, 28))
    assert all(np.array_equal(row, ref[p]) for p, row in at.items())
    assert st2["consumed"] == 28


def test_a_changed_past_range_is_refused_naming_it(cache_dir: Path) -> None:
    _, st = _run(cache_dir, 2, None, 10, skip=((12, 24),))
    assert st["consumed"] == 40 + 12
    with pytest.raises(StateError, match=r"skip range \[12, 36\) lies .*before the saved "
                                         r"position \(52 examples"):
        reader(cache_dir, sw.World(0, 2), skip=((12, 36),)).load_state_dict(st)
    with pytest.raises(StateError, match=r"saved skipping \[12, 24\).*no longer has it"):
        reader(cache_dir, sw.World(0, 2)).load_state_dict(st)
    # ranges from the saved position on may change; the past ones stay
    reader(cache_dir, sw.World(1, 2), skip=((12, 24), (52, 60))).load_state_dict(st)


def test_a_read_config_passes_its_skip_steps_to_the_stream(cache_dir: Path) -> None:
    cfg = ReadConfig.from_dict({"cache": str(cache_dir), "reader": "stream", "seq_len": 12,
                                "seed": 11, "streams": S, "block_chunks": 2,
                                "global_batch_size": 8, "micro_batch_size": BS,
                                "world_size": 2, "skip": [[1, 3]]})
    ds, sampler = cfg.build(rank=1)
    assert sampler is None and ds.skip == ((8, 24),)
    with pytest.raises(ConfigError, match=r"reader 'sft' cannot skip ranges"):
        ReadConfig.from_dict({**cfg.to_dict(), "reader": {"kind": "sft", "seq_len": 12}})


def test_bind_serves_another_world_before_the_first_read(cache_dir: Path) -> None:
    want = rows(reader(cache_dir, sw.World(1, 2), skip=SKIP), 6)
    ds = reader(cache_dir, sw.World(0, 1), skip=SKIP)
    ds.bind(sw.World(1, 2))
    assert ds.world == sw.World(1, 2) and ds.streams == [1, 3]
    ds.bind(sw.World(1, 2))  # the same world again: nothing changes
    assert all(np.array_equal(a, b) for a, b in zip(rows(ds, 6), want, strict=True))
    with pytest.raises(ConfigError, match=r"already read as rank 1 of 2; bind the world "
                                          "before the first read"):
        ds.bind(sw.World(0, 4))
    late = reader(cache_dir, sw.World(0, 1), skip=SKIP)
    late.load_state_dict(ds.state_dict())  # a loaded state continues under the bound world
    late.bind(sw.World(1, 2))
    ref = rows(reader(cache_dir, sw.World(1, 2), skip=SKIP), 10)
    assert all(np.array_equal(a, b) for a, b in zip(rows(late, 4), ref[12:20], strict=True))
    with pytest.raises(ConfigError, match=r"\(2, 4\) of examples is not a whole number of "
                                          r"steps of batch_size × world size = 4"):
        reader(cache_dir, sw.World(0, 1), skip=((2, 4),)).bind(sw.World(0, 2))


def test_a_growing_cache_serves_the_same_examples_less_the_skipped_ones(
        tmp_path: Path) -> None:
    """Follow mode: the run restarted past a range waits for the producer as before."""
    root = make_cache(tmp_path / "c", [sample_docs(40, seed=4)], chunk_docs=2,
                      unfinished_last=True)

    def served(skip: tuple[tuple[int, int], ...]) -> list[np.ndarray]:
        ds = StreamDataset(root, seq_len=8, streams=2, world=sw.World(0, 1), follow=True,
                           block_chunks=2, timeout=0.3, poll_interval=0.05, skip=skip)
        out: list[np.ndarray] = []
        with pytest.raises(sw.ProducerTimeoutError):
            out.extend(e["input_ids"] for e in ds)
        return out

    ref = served(())
    skip = ((4, 10), (14, 16))
    want = [row for p, row in enumerate(ref) if not skipped(p, skip)]
    assert len(ref) > 16
    assert all(np.array_equal(a, b) for a, b in zip(served(skip), want, strict=True))
