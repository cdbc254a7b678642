"""Run under ``torchrun --nproc-per-node 2``: a DDP job (gloo, CPU, a tiny LM, 16 steps)
fed by ``shardwise.torch.loader`` that ends normally, ``runs`` times per rank process.

Each run but the last is a forked child of the rank process that trains, then exits as a
script does: through the interpreter's whole finalisation (exit hooks, module teardown),
where a background thread still in torch's C++ aborts the process ("terminate called
without an active exception"). The last run is the rank process itself, whose exit status
torchrun reports. Each run reads its own copy of the cache, so that its verification
threads have work in flight while it trains and exits. Writes ``exits.r{rank}.json``: the
children's exit statuses (negative: killed by that signal); a child's stderr is
``run{i}/log.r{rank}``. A run that has not ended :data:`HANG_SECONDS` after it started
(the deadlock of torch's gloo teardown, see ``shardwise.integrations.torch``) dumps every
thread's Python stack there and exits 1 (faulthandler), so a hang is a failed run with
its stack, not a test timeout.

    python -m torch.distributed.run --nproc-per-node 2 _exit_job.py CACHE OUT RUNS
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - DDP imports it on first use: once here, not per child
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shardwise as sw
from shardwise.torch import loader

STEPS, SEQ_LEN = 16, 32
HANG_SECONDS = 120.0  # a run takes ~10 s on a 2-core machine under a load of 18


def train(cache: Path, run_dir: Path, rank: int) -> None:
    """One job: copy the cache for this run (rank 0), train 16 steps on both ranks."""
    if rank == 0:
        shutil.copytree(cache, run_dir / "cache")
    dist.barrier()
    ds = sw.TokenDataset(run_dir / "cache", seq_len=SEQ_LEN, seed=1234)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Embedding(ds.cache.vocab_size, 16), nn.Linear(16, ds.cache.vocab_size)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dl = loader(ds, global_batch_size=8, micro_batch_size=4, world=sw.World(rank, 2),
                total_samples=STEPS * 8)
    for batch in dl:
        opt.zero_grad()
        logits = model(batch["input_ids"])
        F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
        opt.step()
    dist.destroy_process_group()


def forked_run(cache: Path, run_dir: Path, rank: int) -> int:
    """One job in a forked child that leaves through the interpreter's normal exit; its
    exit status (negative: the signal that killed it)."""
    pid = os.fork()
    if pid == 0:
        log = os.open(run_dir / f"log.r{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 2)  # its errors, and an abort's message, in the run's directory
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        dist.init_process_group("gloo", init_method=f"file://{run_dir}/store", rank=rank,
                                world_size=2, timeout=timedelta(seconds=600))
        train(cache, run_dir, rank)
        raise SystemExit(0)  # up through the module level: a script's normal end
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main() -> None:
    cache, out, runs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])
    exits = []
    for i in range(runs - 1):
        run_dir = out / f"run{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        exits.append(forked_run(cache, run_dir, rank))
    (out / f"exits.r{rank}.json").write_text(json.dumps(exits))
    last = out / f"run{runs - 1}"
    last.mkdir(parents=True, exist_ok=True)
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    dist.init_process_group("gloo")
    train(cache, last, rank)


if __name__ == "__main__":
    main()
