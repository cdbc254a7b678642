"""llm.datasets' training loop with real processes: two gloo ranks read shard files through
DistributedShardedDataset + ResumableSequentialSampler, save the sampler state mid-shard and
are killed (SIGKILL); two new processes load the state and continue exactly where the
uninterrupted run goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RANK = r"""
import json, os, signal, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
from shardwise.compat.llm import DistributedShardedDataset, ResumableSequentialSampler

class ShardFile:  # a shard: one JSON list per file
    def __init__(self, path):
        with open(path) as f:
            self.rows = json.load(f)
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        return self.rows[i]

shards, store, rank, mode, out = sys.argv[1:6]
rank = int(rank)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
params = {p[:-5]: ((os.path.join(shards, p),), {}) for p in sorted(os.listdir(shards))}
ds = DistributedShardedDataset(ShardFile, params, rank=dist.get_rank(),
                               world_size=dist.get_world_size(), shuffle=True, seed=5,
                               shuffle_within_shard=True)
ds.set_epoch(1)
sampler = ResumableSequentialSampler(ds)
state_file = f"{out}.state.r{rank}"
if mode == "tail":
    with open(state_file) as f:
        sampler.load_state_dict(json.load(f))
shard_of = [ds.rank_index_to_shard_index(i)[0] for i in range(len(ds))]
stop = next(i for i in range(2, len(ds)) if shard_of[i - 1] == shard_of[i])  # inside a shard
got = []
for step, batch in enumerate(DataLoader(ds, sampler=sampler, batch_size=1)):
    got += batch
    if mode == "head" and step + 1 == stop:
        with open(state_file, "w") as f:
            json.dump(sampler.state_dict(), f)
        with open(f"{out}.r{rank}", "w") as f:
            json.dump(got, f)
        os.kill(os.getpid(), signal.SIGKILL)  # the job dies right after its checkpoint
with open(f"{out}.r{rank}", "w") as f:
    json.dump(got, f)
dist.barrier()
dist.destroy_process_group()
"""


def start(tmp_path: Path, shards: Path, mode: str, out: Path
          ) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1")
    store = tmp_path / f"store-{mode}"
    return [subprocess.Popen([sys.executable, "-c", RANK, str(shards), str(store), str(r),
                              mode, str(out)], stderr=subprocess.PIPE, env=env)
            for r in range(2)]


def wait(procs: list[subprocess.Popen[bytes]], killed: bool = False) -> None:
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == (-9 if killed else 0), err.decode()[-3000:]


def test_save_kill_resume_mid_shard_across_processes(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    offset = 0
    for i, n in enumerate([5, 7, 4, 6]):
        (shards / f"shard-{i}.json").write_text(json.dumps([f"s{i}-{j}" for j in range(n)]))
        offset += n
    full = start(tmp_path, shards, "full", tmp_path / "full")  # uninterrupted, alongside
    wait(start(tmp_path, shards, "head", tmp_path / "run"), killed=True)
    heads = [json.loads((tmp_path / f"run.r{r}").read_text()) for r in range(2)]
    wait(start(tmp_path, shards, "tail", tmp_path / "run"))
    wait(full)
    for r in range(2):
        full = json.loads((tmp_path / f"full.r{r}").read_text())
        tail = json.loads((tmp_path / f"run.r{r}").read_text())
        assert 0 < len(heads[r]) < len(full) == offset // 2
        assert heads[r] + tail == full  # continues exactly, mid-shard, epoch 1 restored
    both = sum((json.loads((tmp_path / f"full.r{r}").read_text()) for r in range(2)), [])
    assert len(set(both)) == offset  # the two ranks partition every sample
