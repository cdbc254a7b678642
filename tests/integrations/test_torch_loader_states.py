"""The torch loader's states and run bounds on real cache files: another global batch size
continues the same global order, positions past the end of a run are refused, numpy and
torch counts are counts; what a run leaves out is said; an eval pass sees every example
exactly once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import shardwise as sw
from shardwise.errors import ConfigError, StateError
from shardwise.testing import global_rows
from shardwise.torch import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache  # noqa: E402

SEQ_LEN = 8
TOKENS = 500  # 10 documents of 50: 62 windows of 9 tokens, the last 3 tokens dropped


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = [[(7 * d + t) % 1000 for t in range(50)] for d in range(10)]
    return make_cache(tmp_path_factory.mktemp("states") / "cache", [docs], chunk_docs=4)


@pytest.fixture(scope="module")
def ds(cache_dir: Path) -> sw.TokenDataset:
    return sw.TokenDataset(cache_dir, seq_len=SEQ_LEN, seed=11)


def _rows(ds: sw.TokenDataset, start: int, stop: int) -> np.ndarray:
    return ds.__getitems__(list(range(start, stop)))["input_ids"]


@pytest.mark.parametrize(("gbs", "m", "world"), [(8, 4, 2), (8, 1, 1), (32, 2, 4)])
def test_another_global_batch_size_continues_the_global_order(ds: sw.TokenDataset, gbs: int,
                                                              m: int, world: int) -> None:
    saver = [loader(ds, global_batch_size=16, micro_batch_size=2, world=sw.World(r, 2))
             for r in range(2)]
    its = [iter(d) for d in saver]
    for _ in range(8):  # two global batches of 16
        for it in its:
            next(it)
    state = json.loads(json.dumps(saver[0].state_dict()))
    assert state == saver[1].state_dict() and state["consumed"] == 32

    def resumed(w: sw.World) -> sw.torch.ShardwiseLoader:
        d = loader(ds, global_batch_size=gbs, micro_batch_size=m, world=w)
        d.load_state_dict(state)
        return d

    steps = 5
    got = global_rows(resumed, world, steps)
    assert np.array_equal(got, _rows(ds, 32, 32 + steps * m * world))


def test_a_position_that_is_not_a_whole_new_step_is_refused(ds: sw.TokenDataset) -> None:
    dl = loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 2))
    it = iter(dl)
    next(it)
    state = dl.state_dict()  # 4 examples
    other = loader(ds, global_batch_size=24, micro_batch_size=3, world=sw.World(0, 2))
    with pytest.raises(StateError, match="at 4 examples, not a multiple of micro_batch_size "
                                         "× world size = 6"):
        other.load_state_dict(state)


def test_cyclic_epochs_differ_with_the_step_so_the_state_says_it(ds: sw.TokenDataset) -> None:
    n = len(ds)
    assert n == 62 and n % 4 and n % 8 != n % 4  # the epochs are 60 and 56 examples

    def cyc(m: int, w: int) -> sw.torch.ShardwiseLoader:
        return loader(ds, global_batch_size=m * w, micro_batch_size=m, world=sw.World(0, w),
                      sampler="cyclic", seed=3, data_sharding=False)

    state = cyc(2, 2).state_dict()
    with pytest.raises(StateError, match="epoch_examples: state has 60, this reader has 56"):
        cyc(4, 2).load_state_dict(state)
    cyc(1, 4).load_state_dict(state)  # the same epochs: the same order


def test_a_position_past_the_end_of_a_run_is_refused(ds: sw.TokenDataset) -> None:
    n = len(ds)
    end = n - n % 4
    with pytest.raises(StateError, match="past the end of this run"):
        loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1), epochs=1,
               consumed=10**30)
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1), epochs=1)
    state = dl.state_dict()
    with pytest.raises(StateError, match=f"position is {end + 4:,} examples, past the end of "
                                         f"this run \\({n:,} examples"):
        dl.load_state_dict({**state, "consumed": end + 4})
    dl.load_state_dict({**state, "consumed": end})  # the end itself: nothing left, no error
    assert list(dl) == [] and dl.consumed == end
    kept = sw.TokenDataset(ds.cache, seq_len=SEQ_LEN, drop_last=False)  # 63 examples
    ev = loader(kept, global_batch_size=8, micro_batch_size=4, world=sw.World(0, 2),
                sampler="eval", consumed=64)  # the padded end of one pass
    assert list(ev) == []
    with pytest.raises(StateError, match="one evaluation pass over 63 examples"):
        loader(kept, global_batch_size=8, micro_batch_size=4, world=sw.World(0, 2),
               sampler="eval", consumed=72)


@pytest.mark.parametrize("count", [np.int64(8), np.uint32(8), torch.tensor(8),
                                   np.array(8)], ids=["np.int64", "np.uint32", "tensor",
                                                      "0-d array"])
def test_numpy_and_torch_integers_are_counts(ds: sw.TokenDataset, count: object) -> None:
    kw = {"global_batch_size": 4, "micro_batch_size": 4, "world": sw.World(0, 1)}
    want = next(iter(loader(ds, consumed=8, **kw)))["input_ids"]
    got = next(iter(loader(ds, consumed=count, **kw)))["input_ids"]
    assert torch.equal(got, want)
    dl = loader(ds, **kw)
    dl.load_state_dict({**dl.state_dict(), "consumed": count})
    assert dl.consumed == 8 and type(dl.state_dict()["consumed"]) is int
    st = sw.LoaderState(fingerprint="f", consumed=count)
    assert json.loads(json.dumps(st.to_dict()))["consumed"] == 8
    sized = loader(ds, global_batch_size=np.int64(4), micro_batch_size=torch.tensor(4),
                   world=sw.World(0, 1), epochs=np.int64(1))
    assert len(sized) == len(ds) // 4


@pytest.mark.parametrize("bad", [True, 8.0, "8", torch.tensor(8.0), torch.tensor([8]),
                                 np.bool_(True), -4])
def test_what_is_not_a_count_is_refused(ds: sw.TokenDataset, bad: object) -> None:
    with pytest.raises(StateError, match="consumed must be"):
        loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
               consumed=bad)
    with pytest.raises(StateError, match="consumed must be"):
        sw.LoaderState.from_dict({"kind": "k", "version": 1, "fingerprint": "f",
                                  "consumed": bad})


def test_describe_says_what_the_run_leaves_out(ds: sw.TokenDataset) -> None:
    n = len(ds)
    assert "dropped 3 tokens" in repr(ds)
    dl = loader(ds, global_batch_size=8, micro_batch_size=4, world=sw.World(1, 2), epochs=2)
    d = dl.describe()
    assert d["run_examples"] == 2 * n and d["padding"] == 0
    assert [(x["count"], x["unit"]) for x in d["drops"]] == [(3, "tokens"),
                                                             (2 * n % 8, "examples")]
    assert "dropped 3 tokens" in repr(dl) and "the run's last partial step" in repr(dl)
    cyc = loader(ds, global_batch_size=8, micro_batch_size=4, world=sw.World(0, 2),
                 sampler="cyclic").describe()
    assert (n % 8, "examples per epoch") in [(x["count"], x["unit"]) for x in cyc["drops"]]
    kept = sw.TokenDataset(ds.cache, seq_len=SEQ_LEN, drop_last=False)
    assert "dropped nothing" in repr(kept)
    assert loader(kept, global_batch_size=4, micro_batch_size=2,
                  world=sw.World(0, 2)).describe()["drops"] == []


@pytest.mark.parametrize(("m", "world"), [(3, 2), (4, 3), (5, 1), (1, 4), (7, 2)])
def test_an_eval_pass_sees_every_example_exactly_once(cache_dir: Path, m: int,
                                                      world: int) -> None:
    ds = sw.TokenDataset(cache_dir, seq_len=SEQ_LEN, seed=5, drop_last=False)
    n = len(ds)
    assert n % (m * world)  # the last step needs padding
    seen: list[list[int]] = []
    lengths = []
    for r in range(world):
        dl = loader(ds, global_batch_size=m * world, micro_batch_size=m,
                    world=sw.World(r, world), sampler="eval")
        assert dl.describe()["padding"] == -(-n // (m * world)) * m * world - n
        batches = list(dl)
        lengths.append(len(batches))
        for b in batches:
            real = b["loss_mask"].sum(dim=1) > 0
            assert (b["loss_mask"][~real] == 0).all()
            seen += b["labels"][real].tolist()
    assert len(set(lengths)) == 1  # every rank runs the same number of steps
    want = ds.__getitems__(list(range(n)))["labels"].tolist()
    assert sorted(seen) == sorted(want) and len(seen) == n


def test_eval_refuses_to_drop_or_to_duplicate(ds: sw.TokenDataset) -> None:
    with pytest.raises(ConfigError, match="drop_last=False"):
        loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
               sampler="eval")
    plain = list(range(10))  # index -1 of a list is its last item: a duplicate
    with pytest.raises(ConfigError, match="cannot make"):
        loader(plain, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
               sampler="eval")
    assert len(list(loader(plain, global_batch_size=5, micro_batch_size=5,
                           world=sw.World(0, 1), sampler="eval"))) == 2
