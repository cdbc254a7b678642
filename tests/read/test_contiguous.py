"""Contiguous placement: disjoint equal slices, one shard (+1 prefetched) alive, resumable
sampler, and refusal of samplers that would shard again."""

from __future__ import annotations

import pickle
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from shardwise.errors import ConfigError, StateError
from shardwise.read.external.contiguous import ContiguousSampler, ContiguousShards
from shardwise.read.external.one_ahead import OneAhead
from shardwise.read.guard import check_sampler
from shardwise.world import World

LENGTHS = [5, 0, 9, 3, 12, 7, 4, 3]  # 43 examples: 4 ranks of 10, tail of 3


class Live:
    """Counts shard objects alive now and at most (across the prefetch thread too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = self.made = 0
        self.names: list[str] = []

    def born(self, name: str) -> None:
        with self.lock:
            self.names.append(name)
            self.now += 1
            self.made += 1
            self.peak = max(self.peak, self.now)

    def died(self) -> None:
        with self.lock:
            self.now -= 1


class Shard:
    """A map-style shard: records ``"<name>:<j>"``."""

    def __init__(self, path: Path, live: Live | None = None) -> None:
        self.name = path.stem
        self.n = int(path.read_text())
        if live is not None:
            live.born(self.name)
            weakref.finalize(self, live.died)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: int) -> str:
        if not 0 <= j < self.n:
            raise IndexError(j)
        return f"{self.name}:{j}"


@pytest.fixture()
def shard_files(tmp_path: Path) -> list[Path]:
    paths = []
    for k, n in enumerate(LENGTHS):
        p = tmp_path / f"shard_{k:02d}.txt"
        p.write_text(str(n))
        paths.append(p)
    return paths


def everything(paths: list[Path]) -> list[str]:
    return [f"{p.stem}:{j}" for p in paths for j in range(int(p.read_text()))]


def make(paths: list[Path], live: Live, rank: int, size: int, **kw: object
         ) -> ContiguousShards:
    return ContiguousShards(paths, lambda p: Shard(p, live), world=World(rank, size),
                            **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_four_ranks_disjoint_equal_slices_union_is_all_but_tail(shard_files: list[Path],
                                                                 order: str) -> None:
    live = Live()
    seen: list[list[str]] = []
    for r in range(4):
        ds = make(shard_files, live, r, 4, order=order, seed=3, lengths=LENGTHS)
        assert len(ds) == 10 and ds.dropped == 3 and "dropped 3 examples" in repr(ds)
        seen.append([ds[i] for i in ContiguousSampler(ds)])
        assert ds.peak_loaded_shards <= 2
        ds.close()
    flat = [x for part in seen for x in part]
    assert len(flat) == len(set(flat)) == 40
    # the union is the global order minus exactly its last `dropped` examples
    ordered = ContiguousShards(shard_files, lambda p: Shard(p, live), order=order, seed=3,
                               lengths=LENGTHS)
    global_order = [ordered[i] for i in range(len(ordered))]
    assert flat == global_order[:40] and set(global_order) == set(everything(shard_files))
    assert live.peak <= 2


def test_at_most_one_shard_plus_prefetched_alive_per_rank(shard_files: list[Path]) -> None:
    live = Live()
    # offsets 0 5 5 14 17 29 36 40 43: rank 1 of 2 reads [21, 42) = shards 4, 5, 6, 7
    ds = make(shard_files, live, 1, 2, lengths=LENGTHS)
    assert live.made == 0  # lengths given: no shard opened up front
    for i in range(len(ds)):
        ds[i]
        assert live.now <= 2
    assert ds.peak_loaded_shards == 2  # the next shard was prefetched while one was in use
    assert ds.shards_opened == 4 and live.made == 4  # each once, none of another rank
    ds.close()
    del ds
    assert live.now == 0


def test_lengths_read_once_per_shard_without_lengths(shard_files: list[Path]) -> None:
    live = Live()
    ds = make(shard_files, live, 0, 4)
    assert live.made == len(LENGTHS) and live.peak == 1  # one at a time at start-up
    assert len(ds) == 10


def test_sorted_by_key_and_shuffle_independent_of_list_order(shard_files: list[Path]) -> None:
    live = Live()
    backwards = list(reversed(shard_files))
    a = make(shard_files, live, 0, 1, order="shuffled", seed=5)
    b = make(backwards, live, 0, 1, order="shuffled", seed=5)
    c = make(shard_files, live, 0, 1, order="shuffled", seed=6)
    s = make(backwards, live, 0, 1)
    assert a.sources == b.sources != c.sources
    assert s.sources == shard_files  # sorted by str(path)
    by_size = make(shard_files, live, 0, 1, key=lambda p: (int(p.read_text()), p.name))
    assert [int(p.read_text()) for p in by_size.sources] == sorted(LENGTHS)
    with pytest.raises(ConfigError, match="same sort key"):
        make(shard_files, live, 0, 1, key=lambda p: 1)


def test_sampler_resumes_from_any_index_with_a_log_seek(shard_files: list[Path]) -> None:
    live = Live()
    full = make(shard_files, live, 0, 1, lengths=LENGTHS)
    reference = [full[i] for i in range(len(full))]
    for start in (0, 1, 13, 17, 29, 42, 43):
        ds = make(shard_files, Live(), 0, 1, lengths=LENGTHS)
        sampler = ContiguousSampler(ds, start=start)
        assert len(sampler) == 43 - start
        got = [ds[i] for i in sampler]
        assert got == reference[start:]
    seek = Live()
    ds = make(shard_files, seek, 0, 1, lengths=LENGTHS)
    assert ds.locate(30) == (5, 1)  # shard 5 holds global [29, 36)
    assert ds[30] == "shard_05:1"
    ds.close()
    # seeking opened the shard holding the index (and prefetched the next), nothing before
    assert seek.names == ["shard_05", "shard_06"]
    with pytest.raises(StateError, match="position is 44 examples, past the end"):
        ContiguousSampler(ds, start=44)
    assert list(ContiguousSampler(ds, start=np.int64(42))) == [42]
    with pytest.raises(StateError, match="start must be an integer count"):
        ContiguousSampler(ds, start=True)


def test_wrong_declared_length_is_refused_when_opened(shard_files: list[Path]) -> None:
    bad = list(LENGTHS)
    bad[0] = 6
    ds = make(shard_files, Live(), 0, 1, lengths=bad)
    with pytest.raises(ConfigError, match="has 5 examples but lengths= said 6"):
        ds[0]


def test_refuses_samplers_that_shard_again(shard_files: list[Path]) -> None:
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

    ds = make(shard_files, Live(), 0, 2, lengths=LENGTHS)
    assert ds.is_sharded
    # refused where every sampler asks the length: DistributedSampler's __init__ ...
    with pytest.raises(ConfigError, match="DistributedSampler splits the indices"):
        DistributedSampler(ds, num_replicas=2, rank=0)  # type: ignore[arg-type]
    # ... and accelerate's BatchSamplerShard (HF Trainer's path) when it iterates
    shard = BatchSamplerShard(BatchSampler(SequentialSampler(ds), 2, False),  # type: ignore[arg-type]
                              num_processes=2, process_index=0)
    with pytest.raises(ConfigError, match="BatchSamplerShard splits the indices.*already "
                                          "this rank's share"):
        list(shard)
    one = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=False)  # type: ignore[arg-type]
    assert list(one) == list(range(len(ds)))  # one replica splits nothing
    check_sampler(ContiguousSampler(ds, start=3))
    check_sampler(SequentialSampler(ds))  # type: ignore[arg-type]
    check_sampler(DataLoader(ds, batch_size=4))  # type: ignore[arg-type]


def test_torch_dataloader_workers_resume(shard_files: list[Path]) -> None:
    from torch.utils.data import DataLoader

    ds = ContiguousShards(shard_files, Shard, world=World(1, 2), lengths=LENGTHS)
    reference = [ds[i] for i in range(len(ds))]
    pickle.loads(pickle.dumps(ds))  # workers get a copy without threads or shards
    dl: DataLoader[str] = DataLoader(ds, sampler=ContiguousSampler(ds, start=5),  # type: ignore[arg-type]
                                     batch_size=4, num_workers=2, collate_fn=list)
    assert [x for batch in dl for x in batch] == reference[5:]


def test_one_ahead_errors_surface_on_get_and_jumps_stay_bounded() -> None:
    calls: list[int] = []

    def load(k: int) -> int:
        calls.append(k)
        if k == 3:
            raise ValueError("bad shard 3")
        return k * 10

    oa: OneAhead[int, int] = OneAhead(load)
    assert oa.get(1) == 10
    oa.prefetch(3)
    oa.prefetch(2)  # ignored: one background load at a time
    with pytest.raises(ValueError, match="bad shard 3"):
        oa.get(3)
    oa.prefetch(4)
    assert oa.get(7) == 70 and oa.held() == [7]  # the unused prefetch was dropped
    assert oa.peak_held <= 2 and calls.count(2) == 0
