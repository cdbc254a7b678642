"""A Megatron-style pretraining loop on shardwise.megatron (CPU, gloo, a tiny model).

    shardwise build sample/corpus.jsonl --out out/sample-cache --tokenizer sample/tokenizer.json \
        --append-eod --chunk-docs 64 --overwrite
    torchrun --nproc-per-node 2 docs/recipes/megatron_style.py out/sample-cache 20
    torchrun --nproc-per-node 2 docs/recipes/megatron_style.py out/sample-cache 40  # resumes

The two calls Megatron's pretrain_gpt.py makes are replaced: its dataset builder by
``build_train_valid_test_datasets`` and its loader by ``build_pretraining_data_loader``;
``consumed_train_samples`` in the checkpoint is the whole data position.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardwise as sw
from shardwise.megatron import (
    build_pretraining_data_loader,
    build_train_valid_test_datasets,
    global_batch_size_at,
    num_microbatches,
)

cache, train_iters = sys.argv[1], int(sys.argv[2])
GBS, MBS, RAMPUP, SEQ = 16, 2, [8, 4, 64], 64  # --global-batch-size, --rampup-batch-size …
dist.init_process_group("gloo")
dp = dist.get_world_size()  # with TP/PP: pass world=World(dp_rank, dp_size) below

train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
    f"0.7 {cache} 0.3 {cache}", split="969,30,1", seq_length=SEQ, seed=1234,  # --data-path
    reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)

torch.manual_seed(0)
vocab = sw.open_cache(cache).vocab_size
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, 32), torch.nn.GELU(),
    torch.nn.Linear(32, vocab)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ckpt, iteration, consumed = Path("out/megatron_style.pt"), 0, 0
if ckpt.exists():
    state = torch.load(ckpt, weights_only=True)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    iteration, consumed = state["iteration"], state["consumed_train_samples"]

train_loader = build_pretraining_data_loader(train_ds, consumed, micro_batch_size=MBS,
                                             dataloader_type="single")
batches = iter(train_loader)
while iteration < train_iters:
    n_micro = num_microbatches(consumed, global_batch_size=GBS, micro_batch_size=MBS,
                               data_parallel_size=dp, rampup_batch_size=RAMPUP)
    opt.zero_grad()
    for _ in range(n_micro):
        b = next(batches)  # tokens, labels, loss_mask, position_ids, attention_mask
        logits = model(b["tokens"])  # a real GPT also takes position_ids, attention_mask
        loss = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="none")
        loss = (loss * b["loss_mask"].flatten()).sum() / b["loss_mask"].sum()
        (loss / n_micro).backward()
    opt.step()
    consumed += global_batch_size_at(consumed, GBS, RAMPUP)
    iteration += 1
if dist.get_rank() == 0:
    ckpt.parent.mkdir(exist_ok=True)
    torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                "iteration": iteration, "consumed_train_samples": consumed}, ckpt)
    print(f"iteration {iteration}, consumed_train_samples {consumed}, loss {loss.item():.4f}")
dist.destroy_process_group()
