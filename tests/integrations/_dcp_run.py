"""One rank of a torchtitan-style DCP run (gloo, CPU), for test_dcp.py: ``job(spec)`` in
the shared launch (_launch_run.py), or ``python -m torch.distributed.run … spec.json``.

For each kind (a TokenDataset, a Blend) and micro-batch size in
``micros`` builds this rank's shardwise loader, keeps it in a ``Stateful`` wrapper under
``"dataloader"`` (as torchtitan does) and reads ``steps`` optimizer steps, recording every
micro-batch's ``input_ids`` and the final state. Without
``"resume"`` it ``dcp.save``s the state after step ``save`` (and keeps reading: the
uninterrupted run); with it, it first ``dcp.load``s that checkpoint, on however many ranks
it was launched with, and reads the remaining steps.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

import shardwise as sw
from shardwise.torch import loader


class DataloaderState(Stateful):
    """torchtitan's shape: the trainer's state holds the dataloader through a Stateful."""

    def __init__(self, dl: Any) -> None:
        self.dl = dl

    def state_dict(self) -> dict[str, Any]:
        return self.dl.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.dl.load_state_dict(state_dict)


def dataset(spec: dict[str, Any], kind: str) -> Any:
    seq, seed = spec["seq_len"], spec["seed"]
    if kind == "tokens":
        return sw.TokenDataset(spec["caches"][0], seq_len=seq, seed=seed)
    parts = [sw.TokenDataset(c, seq_len=seq, seed=seed + i)
             for i, c in enumerate(spec["caches"])]
    return sw.Blend(parts, [0.6, 0.4], seed=seed, names=["a", "b"])


def run(spec: dict[str, Any], kind: str, micro: int, rank: int, world: int) -> None:
    dl = loader(dataset(spec, kind), global_batch_size=spec["global"],
                micro_batch_size=micro, world=sw.World(rank, world))
    state = {"dataloader": DataloaderState(dl)}
    ckpt = Path(spec["checkpoints"]) / kind
    first = 0
    if "resume" in spec:
        dcp.load(state, checkpoint_id=str(ckpt))
        first = spec["save"]
    accumulation = spec["global"] // (micro * world)
    seen: list[np.ndarray] = []
    it = iter(dl)
    for step in range(first, spec["steps"]):
        seen.extend(next(it)["input_ids"].numpy().copy() for _ in range(accumulation))
        if "resume" not in spec and step + 1 == spec["save"]:
            dcp.save(state, checkpoint_id=str(ckpt))
    out = Path(spec["record"]) / f"{kind}.m{micro}"
    np.save(f"{out}.seen.r{rank}.npy", np.stack(seen))
    Path(f"{out}.state.r{rank}.json").write_text(json.dumps(dl.state_dict()))


def job(spec: dict[str, Any]) -> None:
    """This rank's runs (the launch's process group kept, or made)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    for kind in spec["kinds"]:
        for micro in spec["micros"]:
            run(spec, kind, micro, rank, world)


if __name__ == "__main__":
    try:
        job(json.loads(Path(sys.argv[1]).read_text()))
    finally:
        dist.destroy_process_group()
