"""One rank of a torchtitan run (gloo, CPU), for test_torchtitan.py: ``job(spec)`` in the
shared launch (_launch_run.py), or ``python -m torch.distributed.run … spec.json``. The rank:

1. walks a TokenDataset with titan's own ``ParallelAwareDataloader`` (as a titan user
   would hand it one: ``dp_rank``/``dp_world_size`` given, its sampler the default, one
   worker) and with a plain ``DataLoader``, recording what each raised
   (``refused.<loader>.r<rank>.txt``);
2. builds ``shardwise.torchtitan.ShardwiseDataLoader`` from its config with the arguments
   titan's trainer passes, hands it to titan's ``CheckpointManager`` (with a tiny model,
   titan's optimizer and LR scheduler containers), trains ``SAVE`` steps, saves, trains
   ``AFTER`` more (the uninterrupted run, ``run.r<rank>.npz``);
3. builds a fresh loader and checkpointer, loads the step-``SAVE`` checkpoint and reads the
   same ``AFTER`` steps again (``resume.r<rank>.npz``).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import shardwise as sw

SEQ_LEN, MICRO, ACCUMULATION, SEED = 16, 2, 2, 5
SAVE, AFTER = 2, 2  # optimizer steps before the checkpoint, and after it


def titan_parts(spec: dict[str, Any], world: int, rank: int) -> tuple[Any, Any]:
    """The dataloader and checkpointer titan's trainer would build for this rank."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

    from shardwise.integrations.torchtitan import ShardwiseDataLoader

    config = ShardwiseDataLoader.Config(dataset_path=spec["cache"], seed=SEED)
    dl = config.build(dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=SEQ_LEN,
                      local_batch_size=MICRO, snapshot_every_n_steps=ACCUMULATION)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = OptimizersContainer.Config(implementation="for-loop", param_groups=[
        ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})
    ]).build(model_parts=[model])
    lr = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=opt,
                                                            training_steps=10)
    ckpt = CheckpointManager.Config(enable=True, folder="checkpoint", interval=1,
                                    keep_latest_k=0).build(
        dataloader=dl, model_parts=[model], optimizers=opt, lr_schedulers=lr, states={},
        sd_adapter=None, base_folder=spec["record"])
    return dl, ckpt


def micro_steps(it: Any, steps: int, accumulation: int) -> dict[str, np.ndarray]:
    """``steps`` optimizer steps of micro-batches, as titan's train loop takes them."""
    inputs, labels = [], []
    for _ in range(steps * accumulation):
        batch, label = next(it)
        inputs.append(batch["input"].numpy().copy())
        labels.append(label.numpy().copy())
    return {"input": np.stack(inputs), "labels": np.stack(labels)}


def refusals(spec: dict[str, Any], rank: int, world: int) -> None:
    from torch.utils.data import DataLoader
    from torchtitan.components.dataloader import ParallelAwareDataloader

    ds = sw.TokenDataset(spec["cache"], seq_len=SEQ_LEN, seed=SEED)
    loaders = {"titan": lambda: ParallelAwareDataloader(ds, dp_rank=rank, dp_world_size=world,
                                                        batch_size=MICRO, num_workers=1),
               "plain": lambda: DataLoader(ds, batch_size=MICRO)}
    for name, make in loaders.items():
        try:
            next(iter(make()))
            said = "not refused"
        except Exception as e:  # the test names what was raised, if not the refusal
            said = f"{type(e).__name__}: {e}"
        Path(spec["record"], f"refused.{name}.r{rank}.txt").write_text(said)


def main(spec: dict[str, Any]) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    refusals(spec, rank, world)
    dl, ckpt = titan_parts(spec, world, rank)
    it = iter(dl)
    micro_steps(it, SAVE, ACCUMULATION)
    ckpt.save(curr_step=SAVE)
    np.savez(Path(spec["record"], f"run.r{rank}.npz"), **micro_steps(it, AFTER, ACCUMULATION))
    ckpt.close()
    dist.barrier()
    dl, ckpt = titan_parts(spec, world, rank)
    assert ckpt.load(step=SAVE)
    np.savez(Path(spec["record"], f"resume.r{rank}.npz"),
             **micro_steps(iter(dl), AFTER, ACCUMULATION))
    ckpt.close()


def job(spec: dict[str, Any]) -> None:
    try:
        main(spec)
    except Exception:
        Path(spec["record"], f"error.r{os.environ['RANK']}.txt").write_text(
            traceback.format_exc())
        raise


if __name__ == "__main__":
    job(json.loads(Path(sys.argv[1]).read_text()))
    dist.barrier()
    dist.destroy_process_group()
