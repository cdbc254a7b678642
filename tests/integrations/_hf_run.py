"""One rank of a ShardwiseTrainer run (gloo, CPU), for test_hf_trainer.py: ``job(spec)`` in
the shared launch (_launch_run.py), or ``python -m torch.distributed.run … spec.json``.

Trains a 2-layer GPT-2 from a config and records, per micro-step, the
``input_ids`` it received, the Trainer's loss and a hand-computed next-token
cross-entropy over the same logits; then the final parameters (rank 0). With
``"misuse": true`` it instead checks that accelerate's wrappers are refused.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import shardwise as sw
from shardwise.hf import ShardwiseTrainer


class Recording(ShardwiseTrainer):
    """Records what every micro-step trained on, and the loss against a manual one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[np.ndarray] = []
        self.losses: list[tuple[float, float]] = []

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        self.seen.append(inputs["input_ids"].numpy().copy())
        logits = outputs.logits.float()
        target = inputs["shift_labels"]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                             ignore_index=-100, reduction="sum")
        if num_items_in_batch is not None:  # Trainer scales by the step's token count
            manual = ce / num_items_in_batch
            # Trainer multiplies by the world size for DDP's mean (average_tokens_across_devices)
            if self.args.average_tokens_across_devices and self.args.world_size > 1:
                manual = manual * self.args.world_size
        else:
            manual = ce / (target != -100).sum()
        self.losses.append((float(loss.detach()), float(manual.detach())))
        return (loss, outputs) if return_outputs else loss


def model(vocab: int, seq_len: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def train(spec: dict[str, Any]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    ds = sw.TokenDataset(spec["cache"], seq_len=spec["seq_len"], seed=7,
                         reset_position_ids=True)
    args = TrainingArguments(
        output_dir=spec["output_dir"], per_device_train_batch_size=spec["micro"],
        gradient_accumulation_steps=spec["accumulation"], max_steps=spec["max_steps"],
        save_strategy="steps", save_steps=spec["save_steps"], logging_steps=1,
        learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, seed=0,
        report_to=[], use_cpu=True, ddp_backend="gloo", disable_tqdm=True,
        dataloader_num_workers=0, save_only_model=False, max_grad_norm=0.0)
    trainer = Recording(model=model(spec["vocab"], spec["seq_len"]), args=args,
                        train_dataset=ds)
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    out = Path(spec["record"])
    np.save(out / f"seen.r{rank}.npy", np.stack(trainer.seen))
    np.save(out / f"losses.r{rank}.npy", np.asarray(trainer.losses))
    if rank == 0:
        params = {k: v.detach().numpy() for k, v in trainer.model.state_dict().items()}
        np.savez(out / "params.npz", **params)


def misuse(spec: dict[str, Any]) -> None:
    """Each way accelerate would shard a shardwise reader again, or dispatch it."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from shardwise.torch import loader

    rank = int(os.environ.get("RANK", "0"))
    acc = Accelerator(cpu=True)
    ds = sw.TokenDataset(spec["cache"], seq_len=spec["seq_len"], seed=7)
    stream = sw.StreamDataset(spec["cache"], seq_len=spec["seq_len"], streams=2, seed=7)
    cases = {
        "prepare(loader)": lambda: acc.prepare(loader(ds, global_batch_size=4,
                                                      micro_batch_size=2)),
        "prepare(stream) no dispatch": lambda: _no_dispatch(stream),
    }
    if rank == 0:  # the dispatcher reads on rank 0 only (other ranks wait for its scatter)
        cases["prepare(stream) dispatch"] = lambda: acc.prepare(DataLoader(stream,
                                                                           batch_size=2))
    result = {}
    for name, make in cases.items():
        try:
            next(iter(make()))
            result[name] = "not refused"
        except sw.ConfigError as e:
            result[name] = str(e)
    Path(spec["record"], f"misuse.r{rank}.json").write_text(json.dumps(result))


def _no_dispatch(stream: Any) -> Any:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches=False))
    return acc.prepare(DataLoader(stream, batch_size=2))


def _leave_the_group() -> None:
    """Every rank waits for the others, then tears the group down: a rank that exits while
    its peer's gloo threads still talk to it aborts the peer ("terminate called without an
    active exception", SIGABRT; seen once under load). Trainer leaves that to the script."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def job(spec: dict[str, Any]) -> None:
    misuse(spec) if spec.get("misuse") else train(spec)


if __name__ == "__main__":
    job(json.loads(Path(sys.argv[1]).read_text()))
    _leave_the_group()
