"""Run under ``torchrun --nproc-per-node 2``: a Megatron-style pretraining loop (gloo, CPU,
a tiny 2-layer LM) on ``shardwise.megatron``, with Megatron's batch-size ramp-up and its
checkpoint arithmetic (``iteration``, ``consumed_train_samples``). Saves a checkpoint at
``save_at``; with ``resume``, starts from it. Writes what each step saw and the loss."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shardwise as sw
from shardwise.megatron import (
    build_pretraining_data_loader,
    build_train_valid_test_datasets,
    global_batch_size_at,
    num_microbatches,
)


class TinyLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        self.layers = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim),
                                    nn.GELU())
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.tok(tokens) + self.pos(position_ids)))


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, valid, _ = build_train_valid_test_datasets(
        spec["cache"], split="98,2,0", seq_length=spec["seq_len"], seed=1234,
        reset_position_ids=True, eod_mask_loss=True, create_attention_mask=False)
    vocab = sw.open_cache(spec["cache"]).vocab_size
    model = nn.parallel.DistributedDataParallel(TinyLM(vocab, spec["seq_len"]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    iteration, consumed = 0, 0
    ckpt = Path(spec["ckpt"])
    if spec["resume"]:
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        iteration, consumed = state["iteration"], state["consumed_train_samples"]
    loader = build_pretraining_data_loader(train, consumed, micro_batch_size=spec["mbs"],
                                           dataloader_type=spec["dataloader_type"], seed=7)
    batches = iter(loader)
    steps = []
    while iteration < spec["steps"]:
        n_micro = num_microbatches(consumed, global_batch_size=spec["gbs"],
                                   micro_batch_size=spec["mbs"], data_parallel_size=world,
                                   rampup_batch_size=spec["rampup"])
        opt.zero_grad()
        rows, total = [], torch.zeros(2, dtype=torch.float64)
        for _ in range(n_micro):
            b = next(batches)
            logits = model(b["tokens"], b["position_ids"])
            ce = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="none")
            mask = b["loss_mask"].flatten()
            ((ce * mask).sum() / mask.sum() / n_micro).backward()
            total += torch.stack([(ce * mask).sum().double().detach(), mask.sum().double()])
            rows.append(b["tokens"].tolist())
        opt.step()
        dist.all_reduce(total)
        consumed += global_batch_size_at(consumed, spec["gbs"], spec["rampup"])
        iteration += 1
        steps.append({"iteration": iteration, "consumed": consumed, "rows": rows,
                      "loss": float(total[0] / total[1])})
        if iteration == spec["save_at"] and not spec["resume"]:
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "iteration": iteration, "consumed_train_samples": consumed},
                           ckpt)
            dist.barrier()
    params = [p.detach().double().sum().item() for p in model.parameters()]
    out = {"steps": steps, "params": params, "valid_len": len(valid) if valid else 0}
    tag = "resumed" if spec["resume"] else "full"
    Path(spec["out"], f"{tag}.r{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
