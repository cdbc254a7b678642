"""One rank of a Lightning run (DDP, gloo, CPU), for test_lightning.py: ``job(spec)`` in the
shared launch (_launch_run.py), or ``python -m torch.distributed.run … spec.json``.

For each run ``<loader>-<sampler>`` (loader "shardwise":
``shardwise.torch.loader``; "torchdata": a ``StatefulDataLoader`` over
``shardwise.torchdata.batch_sampler``; sampler "cyclic": Lightning epochs of a known
length, "single": endless, so Lightning prefetches a micro-batch to know the last) it
trains a tiny linear LM with a ModelCheckpoint at every step, recording the
``input_ids`` of every micro-step; ``resume`` names a checkpoint to continue from
instead. Lightning's defaults stay (``use_distributed_sampler=True``) unless
``plain`` is set (the issue's setup: the loader handed to Lightning directly).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

import shardwise as sw
import shardwise.torch as swt
from shardwise.torchdata import batch_sampler

warnings.filterwarnings("ignore")


class TinyLM(L.LightningModule):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, 8)
        self.out = torch.nn.Linear(8, vocab)
        self.seen: list[np.ndarray] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids = batch["input_ids"].long()
        self.seen.append(ids.numpy().copy())
        logits = self.out(self.emb(ids[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def __init__(self, spec: dict[str, Any], kind: str) -> None:
        super().__init__()
        self.spec, self.kind = spec, kind

    def train_dataloader(self) -> Any:
        s = self.spec
        ds = sw.TokenDataset(s["cache"], seq_len=s["seq_len"], seed=7)
        loader_kind, sampler = self.kind.split("-")
        args = dict(global_batch_size=s["global"], micro_batch_size=s["micro"],
                    sampler=sampler, data_sharding=False)
        if loader_kind == "shardwise":
            dl = swt.loader(ds, **args)
        else:
            dl = StatefulDataLoader(ds, batch_sampler=batch_sampler(ds, **args),
                                    collate_fn=swt.collate)
        if s.get("plain"):
            return dl
        from shardwise.lightning import loader
        return loader(dl)


def run(spec: dict[str, Any], kind: str, world: int) -> None:
    record = Path(spec["record"]) / kind
    callbacks: list[Any] = [ModelCheckpoint(dirpath=record / "ckpt", filename="{step}",
                                            every_n_train_steps=1, save_top_k=-1)]
    if not spec.get("plain"):
        from shardwise.lightning import TrainedPosition
        callbacks.append(TrainedPosition())
    trainer = L.Trainer(accelerator="cpu", devices=world,
                        strategy="ddp" if world > 1 else "auto",
                        **({"max_epochs": spec["epochs"]} if kind.endswith("cyclic")
                           else {"max_steps": spec["steps"], "max_epochs": -1}),
                        accumulate_grad_batches=spec["global"] // (spec["micro"] * world),
                        callbacks=callbacks, logger=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        **({"use_distributed_sampler": False} if spec.get("plain") else {}))
    model = TinyLM(spec["vocab"])
    resume = spec.get("resume")
    trainer.fit(model, datamodule=Data(spec, kind),
                ckpt_path=None if resume is None else str(Path(resume) / kind / "ckpt" /
                                                          f"step={spec['step']}.ckpt"))
    rank = trainer.global_rank
    out = Path(spec["record"]) / f"{kind}.seen.r{rank}.npy"
    np.save(out, np.stack(model.seen))
    if rank == 0:
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        np.save(Path(spec["record"]) / f"{kind}.params.npy", params.numpy())


def job(spec: dict[str, Any]) -> None:
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    for kind in spec["kinds"]:
        run(spec, kind, world)


if __name__ == "__main__":
    job(json.loads(Path(sys.argv[1]).read_text()))
