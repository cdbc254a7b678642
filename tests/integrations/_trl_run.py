"""One rank of TRL's SFTTrainer with ShardwiseTrainerMixin (gloo, CPU), for test_trl.py:
``job(spec)`` in the shared launch (_launch_run.py), or under torchrun with argv spec.json.
One launch trains three times:

* ``sft``: a PackedSFT of ChatProcessor records (assistant turns trained). Per micro-step:
  the ``input_ids`` and ``position_ids`` the model got, TRL's loss, the Trainer's token
  count, and the model's log-probability of every next token (the test computes the masked
  cross-entropy by hand from these and the records).
* ``tokens``: a TokenDataset, checkpointing mid-run: per micro-step ``input_ids``; final
  parameters.
* ``resume``: a fresh model resumed from the ``tokens`` checkpoint on the same ranks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

import shardwise as sw
from shardwise.hf import ShardwiseTrainerMixin


class Recording(ShardwiseTrainerMixin, SFTTrainer):
    """Records what every micro-step trained on and the loss TRL computed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rec: dict[str, list[Any]] = {"input_ids": [], "position_ids": [], "loss": [],
                                          "items": [], "logp": []}

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        loss = super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        ids = inputs["input_ids"]
        with torch.no_grad():  # the model's own forward (TRL patched in a fused head beside it)
            logits = model(input_ids=ids, position_ids=inputs.get("position_ids")).logits
            logp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(
                -1, ids[:, 1:, None])[..., 0]
        r = self.rec
        r["input_ids"].append(ids.numpy().copy())
        pos = inputs.get("position_ids")
        r["position_ids"].append(None if pos is None else pos.numpy().copy())
        r["loss"].append(float(loss.detach()))
        r["items"].append(-1 if num_items_in_batch is None else int(num_items_in_batch))
        r["logp"].append(logp.numpy())
        return loss


def model(vocab: int, seq_len: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def config(spec: dict[str, Any], out: str, steps: int, save: int | None) -> SFTConfig:
    return SFTConfig(
        output_dir=out, per_device_train_batch_size=spec["micro"],
        gradient_accumulation_steps=spec["accumulation"], max_steps=steps,
        save_strategy="steps" if save else "no", save_steps=save or 500, logging_steps=1,
        learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, seed=0,
        report_to=[], use_cpu=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None, disable_tqdm=True, bf16=False,
        activation_checkpointing=False, dataloader_num_workers=0, max_grad_norm=0.0)


def train(spec: dict[str, Any], name: str, ds: Any, steps: int, save: int | None = None,
          resume: str | None = None) -> Recording:
    tok = PreTrainedTokenizerFast(tokenizer_file=spec["tokenizer"])
    trainer = Recording(model=model(spec["vocab"], spec["n_positions"]),
                        args=config(spec, str(Path(spec["record"]) / name), steps, save),
                        train_dataset=ds, processing_class=tok)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def save(spec: dict[str, Any], name: str, trainer: Recording, rank: int) -> None:
    out = Path(spec["record"]) / f"{name}.r{rank}.npz"
    arrays = {k: np.stack(v) for k, v in trainer.rec.items() if v and v[0] is not None}
    np.savez(out, **arrays)
    if rank == 0:
        params = {k: v.detach().numpy() for k, v in trainer.model.state_dict().items()}
        np.savez(Path(spec["record"]) / f"{name}.params.npz", **params)


def main(spec: dict[str, Any]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    records = [json.loads(line) for line in Path(spec["records"]).read_text().splitlines()]
    sft = sw.PackedSFT(records, seq_len=spec["sft_len"], group_size=16, seed=3, epochs=None)
    save(spec, "sft", train(spec, "sft", sft, spec["sft_steps"]), rank)

    tokens = sw.TokenDataset(spec["cache"], seq_len=spec["seq_len"], seed=7,
                             reset_position_ids=True)
    save(spec, "tokens", train(spec, "tokens", tokens, spec["steps"], spec["save"]), rank)
    ckpt = str(Path(spec["record"]) / "tokens" / f"checkpoint-{spec['save']}")
    tokens = sw.TokenDataset(spec["cache"], seq_len=spec["seq_len"], seed=7,
                             reset_position_ids=True)
    save(spec, "resume", train(spec, "resume", tokens, spec["steps"], resume=ckpt), rank)


def _leave_the_group() -> None:
    """Every rank waits for the others, then tears the group down (see _hf_run.py)."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


job = main


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
    _leave_the_group()
