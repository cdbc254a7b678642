"""One rank of OLMo-core's data-loader protocol over shardwise (gloo, CPU), for test_olmo.py
(``job(spec)`` in the shared launch, _launch_run.py, or under torchrun): the calls OLMo's
``Trainer`` makes, in its order.

``Trainer._fit_epoch``: ``reshuffle(epoch)``, iterate (OLMo's ``__iter__`` counts
``batches_processed`` and checks each batch's size), ``reset()`` at the epoch's end;
``Trainer.state_dict`` holds ``data_loader.state_dict()``, saved per rank with
``torch.save``; ``Trainer.load_state_dict`` calls ``data_loader.load_state_dict`` on a
fresh loader, and the next ``_fit_epoch`` calls ``reshuffle`` again. Three runs:
``full`` (STEPS steps, crossing an epoch), ``first`` (STEPS // 2, then saved) and
``resumed`` (a new loader restored from that file, to STEPS); each rank records the
``index`` (global positions) and ``input_ids`` of every batch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import shardwise as sw
from shardwise.olmo import ShardwiseDataLoader


def _loader(spec: dict[str, Any]) -> ShardwiseDataLoader:
    ds = sw.TokenDataset(spec["cache"], seq_len=spec["seq_len"], seed=spec["seed"])
    return ShardwiseDataLoader(ds, global_batch_size=spec["global"] * spec["seq_len"],
                               micro_batch_size=spec["micro"],
                               work_dir=Path(spec["record"]) / "work")


def fit(loader: ShardwiseDataLoader, epoch: int, steps: int, seen: list[Any]) -> int:
    """OLMo's fit loop (Trainer.fit → _fit_epoch) until ``steps`` batches are seen in
    all; returns the epoch it stopped in."""
    while True:
        loader.reshuffle(epoch)
        for batch in loader:
            seen.append((batch["index"].numpy().copy(), batch["input_ids"].numpy().copy()))
            if len(seen) == steps:
                return epoch
        epoch += 1
        loader.reset()


def main(spec: dict[str, Any]) -> None:
    record, rank, steps = Path(spec["record"]), int(os.environ["RANK"]), spec["steps"]
    full: list[Any] = []
    fit(_loader(spec), 1, steps, full)
    first: list[Any] = []
    loader = _loader(spec)
    epoch = fit(loader, 1, steps // 2, first)
    torch.save({"data_loader": loader.state_dict(), "epoch": epoch},
               record / f"trainer.r{rank}.pt")  # OLMo's Trainer state, per rank
    dist.barrier()
    saved = torch.load(record / f"trainer.r{rank}.pt", weights_only=False)
    resumed_loader = _loader(spec)
    resumed_loader.load_state_dict(saved["data_loader"])
    resumed = list(first)
    fit(resumed_loader, saved["epoch"], steps, resumed)
    for name, seen in (("full", full), ("resumed", resumed)):
        np.save(record / f"{name}.index.r{rank}.npy", np.stack([i for i, _ in seen]))
        np.save(record / f"{name}.rows.r{rank}.npy", np.stack([r for _, r in seen]))
    (record / f"state.r{rank}.json").write_text(json.dumps(saved["data_loader"]))


def job(spec: dict[str, Any]) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    main(spec)


if __name__ == "__main__":
    job(json.loads(Path(sys.argv[1]).read_text()))
    dist.barrier()
    dist.destroy_process_group()
