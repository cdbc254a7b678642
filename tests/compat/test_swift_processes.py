"""The plan's setting with real processes: a producer writes ``chunk_NNNNN.jsonl`` (temporary
name, then rename) while two gloo ranks read a LazyShardedDataset through HF Trainer's path
(accelerate's prepare_data_loader → BatchSamplerShard). Each rank receives every sample
of its chunks exactly once, in order, and the producer deletes what the ranks marked
``.completed``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PRODUCER = r"""
import json, os, sys, time
from pathlib import Path
from shardwise.read.external.producer_dir import chunk_indices, delete_finished

d, n, k = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
regex, deleted = r"chunk_(\d+)\.jsonl", []
for c in range(n):
    lines = [json.dumps({"id": f"{c}-{j}", "text": f"sample {c}/{j}"}) + "\n" for j in range(k)]
    tmp = d / f".tmp-chunk_{c:05d}.jsonl"
    with open(tmp, "w") as f:
        f.writelines(lines[:1]); f.flush(); time.sleep(0.02)
        f.writelines(lines[1:]); f.flush(); os.fsync(f.fileno())
    os.rename(tmp, d / f"chunk_{c:05d}.jsonl")
    time.sleep(0.03)
    deleted += delete_finished(d, 2, pattern=regex, marker=".completed")
deadline = time.monotonic() + 60
while chunk_indices(d, regex) and time.monotonic() < deadline:
    deleted += delete_finished(d, 2, pattern=regex, marker=".completed")
    time.sleep(0.02)
print(json.dumps({"deleted": sorted(deleted)}))
"""

RANK = r"""
import json, sys
import torch.distributed as dist
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from torch.utils.data import DataLoader
from shardwise.compat.swift import LazyShardedDataset

d, store, rank, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

def encode(sample, return_length=False):  # template.encode's shape
    ids = [ord(ch) for ch in sample["text"]]
    return {"id": sample["id"], "input_ids": ids, "length": len(ids) if return_length else None}

ds = LazyShardedDataset(d, encode, samples_per_chunk=4, max_samples=n,  # world: torch.distributed
                        wait_poll_interval=0.02, max_wait_time=60)
dl = DataLoader(ds, batch_size=2, shuffle=False, collate_fn=lambda b: b)
dl = prepare_data_loader(dl, num_processes=2, process_index=rank, put_on_device=False)
out = {"world": [ds.rank, ds.world_size], "batches": len(dl), "ids": [], "lengths": [],
       "sharded_by": type(dl.batch_sampler).__name__}
for batch in dl:
    out["ids"] += [x["id"] for x in batch]
    out["lengths"] += [x["length"] for x in batch]
out["peak"] = ds.dataset.peak_loaded_chunks
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out))
"""

CHUNKS, PER_CHUNK = 6, 4


def test_two_gloo_ranks_through_batch_sampler_shard_while_a_producer_writes(tmp_path: Path
                                                                          ) -> None:
    d = tmp_path / "chunks"
    d.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1")
    py = [sys.executable, "-c"]
    n = CHUNKS * PER_CHUNK
    ranks = [subprocess.Popen([*py, RANK, str(d), str(tmp_path / "store"), str(r), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for r in range(2)]
    producer = subprocess.Popen([*py, PRODUCER, str(d), str(CHUNKS), str(PER_CHUNK)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    reports = []
    for p in [*ranks, producer]:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-3000:]
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    *got, made = reports
    for r, rep in enumerate(got):
        assert rep["world"] == [r, 2] and rep["sharded_by"] == "BatchSamplerShard"
        mine = range(r, CHUNKS, 2)
        assert rep["ids"] == [f"{c}-{j}" for c in mine for j in range(PER_CHUNK)]
        assert rep["batches"] == n // 2 // 2
        assert all(isinstance(x, int) and x > 0 for x in rep["lengths"])  # return_length
        assert rep["peak"] <= 2
    assert made["deleted"] == list(range(CHUNKS))  # every chunk marked .completed, freed
    assert not list(d.glob("chunk_*"))
