"""World: detection, the refusal of a silently duplicating one-rank world, and the slicing
rules every reader shares."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from shardwise.errors import ConfigError
from shardwise.world import World


@pytest.fixture()
def job_of_four(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's environment for rank 2 of 4 (no process group initialised)."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")


def test_detect_reads_torchrun_environment(job_of_four: None) -> None:
    w = World.detect()
    assert (w.rank, w.size, w.local_rank, w.local_size) == (2, 4, 0, 2)
    assert w == World(2, 4)  # where a rank sits on its node is not part of its identity


def test_detect_without_a_job_is_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert World.detect() == World(0, 1)
    assert World.resolve(None) == World(0, 1)
    assert World.resolve(World()) == World(0, 1)  # alone, one rank is the truth


def test_bad_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "two")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="RANK='two' is not an integer"):
        World.detect()


def test_one_rank_inside_a_job_is_refused_unless_deliberate(job_of_four: None) -> None:
    assert World.resolve(None) == World(2, 4)
    for one in (World(), World(0, 1)):
        with pytest.raises(ConfigError, match=r"inside a job of 4 ranks.*World\.single\(\)"):
            World.resolve(one, reader="RecordStream")
    assert World.resolve(World.single()) == World(0, 1)
    assert World.resolve(World(1, 2)) == World(1, 2)  # a data-parallel subgroup: trusted


def test_numpy_and_torch_integers_are_ranks() -> None:
    import torch

    assert World(np.int64(1), np.int32(4)) == World(1, 4)
    assert World(torch.tensor(3), torch.tensor(4)) == World(3, 4)
    for bad in (dict(rank=4, size=4), dict(rank=-1, size=2), dict(rank=0, size=0),
                dict(rank=True, size=2), dict(rank=0.0, size=2)):
        with pytest.raises(ConfigError):
            World(**bad)  # type: ignore[arg-type]


def test_round_robin_and_owns() -> None:
    w = World(1, 4)
    assert list(w.round_robin(10)) == [1, 5, 9]
    assert [i for i in range(10) if w.owns(i)] == [1, 5, 9]
    covered = sorted(i for r in range(4) for i in World(r, 4).round_robin(10))
    assert covered == list(range(10))


def test_streams_split_over_ranks_and_workers() -> None:
    assert World(1, 2).streams(8) == [1, 3, 5, 7]
    assert World(1, 2).streams(8, worker=(1, 2)) == [3, 7]
    readers = [World(r, 2).streams(8, worker=(w, 2)) for r in range(2) for w in range(2)]
    assert sorted(s for rs in readers for s in rs) == list(range(8))
    with pytest.raises(ConfigError, match=r"worker must be \(id, num_workers\)"):
        World(0, 2).streams(8, worker=(3, 3))


@pytest.mark.parametrize(("readers", "n_streams"),
                         [(1, 4), (2, 4), (4, 4), (3, 4), (8, 4), (6, 4), (5, 12), (12, 8)])
def test_stream_share_serves_every_global_example_once(readers: int, n_streams: int) -> None:
    """Levanter's rule for any R against R*: reader q's j-th example is global j·R + q,
    found as example first(t) + u·step of streams[t] (j = u·len(streams) + t)."""
    for q in range(readers):
        share = World(q, readers).stream_share(n_streams)
        m = len(share.streams)
        assert m == n_streams // math.gcd(readers, n_streams)
        assert all(s % share.group == q % share.group for s in share.streams)
        for j in range(3 * m * share.step + 5):
            u, t = divmod(j, m)
            i = j * readers + q
            assert share.example(j) == (i % n_streams, i // n_streams)
            assert (share.streams[t], share.first(t) + u * share.step) == share.example(j)
    # the R | R* layout is unchanged: rank r reads streams s % R == r, all examples
    assert World(1, 2).stream_share(8).step == 1
    assert World(5, 8).stream_share(4).streams == [1]
    assert World(0, 3).streams(4) == [0, 3, 2, 1]


def test_contiguous_slices_report_the_dropped_tail() -> None:
    slices = [World(r, 3).contiguous(10) for r in range(3)]
    assert [(s.start, s.stop) for s, _ in slices] == [(0, 3), (3, 6), (6, 9)]
    assert {d for _, d in slices} == {1}
    with pytest.raises(ConfigError, match="2 items cannot give each of 3 ranks"):
        World(0, 3).contiguous(2)


KEEPS_GROUPS = """
import tempfile
import torch.distributed as dist
from shardwise.concurrency import shutdown
from shardwise.world import World

def kept():
    return any(dist.group.WORLD in held for held in shutdown._held.values())

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0,
                        world_size=1)
print(kept())
print(World.detect())
print(kept())
"""


def test_detecting_a_torch_world_keeps_its_groups_until_the_exit_hook() -> None:
    """Every reader resolves its world through World.detect: in a torch.distributed job it
    keeps torch's groups until shardwise's exit hook, so that freeing a DDP model (a
    Megatron loop's, an HF Trainer's, not only shardwise.torch.loader's) never destroys the
    group with the GIL held (a hang, or an abort at exit: docs/DESIGN.md, contract 12)."""
    done = subprocess.run([sys.executable, "-c", KEEPS_GROUPS], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["False", "rank 0 of 1", "True"], done.stdout
