"""litgpt 0.5.13 and Lightning Fabric over shardwise, for test_litgpt.py (CPU): ``job(spec)``
in the shared launch (_launch_run.py), or ``python … spec.json``. ``spec["mode"]``:

- ``"ddp"`` (under torchrun, 2 processes): a Fabric DDP on CPU. First a plain Fabric loop:
  ``fabric.setup_dataloaders(shardwise.torch.loader(ds, ...))`` reads ``READ`` micro-batches,
  ``fabric.save`` s the loader, reads ``READ`` more (``fabric.r<rank>.npz: run``); a fresh
  loader ``fabric.load`` s the checkpoint and reads again (``resumed``). Then litgpt's own
  ``pretrain.main`` with that Fabric and ``shardwise.litgpt.ShardwiseData``: a run of
  ``STEPS`` optimizer steps saving after each, and a run resumed from step 1.
- ``"single"`` (one process, without torchrun's rank variables): litgpt's
  ``pretrain.setup`` on one device, the same two runs.

Every micro-batch litgpt trains on is recorded where the model sees it (``GPT.forward`` in
training mode): ``litgpt.<run>.r<rank>.npy``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

SEQ_LEN, MICRO, GLOBAL, SEED, VOCAB = 16, 2, 8, 3, 500
STEPS, READ = 3, 2
SEEN: list[np.ndarray] = []


def record_training_inputs() -> None:
    from litgpt.model import GPT

    forward = GPT.forward

    def recording(self: Any, idx: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.training and idx.device.type != "meta":  # not litgpt's FLOP count
            SEEN.append(idx.detach().cpu().numpy().copy())
        return forward(self, idx, *args, **kwargs)

    GPT.forward = recording  # type: ignore[method-assign]


def model_config() -> Any:
    from litgpt import Config

    return Config(name="tiny", block_size=SEQ_LEN, vocab_size=VOCAB, padded_vocab_size=512,
                  n_layer=1, n_head=2, n_embd=16, rotary_percentage=1.0,
                  parallel_residual=False, bias=False, norm_class_name="RMSNorm",
                  mlp_class_name="LLaMAMLP", intermediate_size=32)


def litgpt_args(world: int) -> dict[str, Any]:
    from litgpt.args import EvalArgs, TrainArgs

    tokens = STEPS * GLOBAL * SEQ_LEN  # max_tokens: STEPS optimizer steps in all
    return {"train": TrainArgs(save_interval=1, log_interval=1, global_batch_size=GLOBAL,
                               micro_batch_size=MICRO, max_tokens=tokens, max_norm=1.0,
                               lr_warmup_steps=1, min_lr=1e-4),
            "eval": EvalArgs(interval=1000, max_iters=1, final_validation=False)}


def litgpt_runs(spec: dict[str, Any], fabric: Any, rank: int, world: int) -> None:
    """A run of STEPS steps, then one resumed from its step-1 checkpoint."""
    from litgpt import pretrain

    from shardwise.integrations.litgpt import ShardwiseData

    record = Path(spec["record"])
    for run, resume in (("run", False), ("resumed", record / "litgpt-run" / "step-00000001"
                                                           / "lit_model.pth")):
        SEEN.clear()
        data = ShardwiseData(cache=spec["cache"], seed=SEED)
        out = record / f"litgpt-{run}"
        if fabric is None:
            pretrain.setup("tiny", model_config=model_config(), out_dir=out,
                           precision="32-true", resume=resume, data=data, devices=1,
                           logger_name="csv", seed=0, optimizer="AdamW",
                           **litgpt_args(world))
        else:
            pretrain.main(fabric=fabric, devices=world, seed=0, initial_checkpoint_dir=None,
                          resume=resume, config=model_config(), data=data, out_dir=out,
                          tokenizer_dir=None, tokenizer=None, optimizer="AdamW",
                          **litgpt_args(world))
        np.save(record / f"litgpt.{run}.r{rank}.npy", np.stack(SEEN))


def fabric_loop(spec: dict[str, Any], fabric: Any, rank: int) -> None:
    """A user's own loop: setup_dataloaders, save, load."""
    import shardwise as sw
    from shardwise.torch import loader

    def make() -> Any:
        ds = sw.TokenDataset(spec["cache"], seq_len=SEQ_LEN, seed=SEED)
        return fabric.setup_dataloaders(loader(ds, global_batch_size=GLOBAL,
                                               micro_batch_size=MICRO))

    path = Path(spec["record"]) / "fabric.ckpt"
    dl = make()
    it = iter(dl)
    first = [next(it)["input_ids"].numpy() for _ in range(READ)]
    fabric.save(path, {"loader": dl})
    run = [next(it)["input_ids"].numpy() for _ in range(READ)]
    dl = make()
    fabric.load(path, {"loader": dl})
    it = iter(dl)
    resumed = [next(it)["input_ids"].numpy() for _ in range(READ)]
    np.savez(Path(spec["record"]) / f"fabric.r{rank}.npz", first=np.stack(first),
             run=np.stack(run), resumed=np.stack(resumed))


def job(spec: dict[str, Any]) -> None:
    """``main``; a single-device run hides torchrun's rank variables from Lightning, as a
    process of its own would not have them."""
    if spec["mode"] != "single":
        return main(spec)
    hidden = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
              if k in os.environ}
    try:
        main(spec)
    finally:
        os.environ.update(hidden)


def main(spec: dict[str, Any]) -> None:
    record_training_inputs()
    if spec["mode"] == "single":
        litgpt_runs(spec, None, 0, 1)
        return
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
                      strategy="ddp", precision="32-true")
    fabric.launch()
    fabric_loop(spec, fabric, fabric.global_rank)
    litgpt_runs(spec, fabric, fabric.global_rank, fabric.world_size)
    fabric.barrier()


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
