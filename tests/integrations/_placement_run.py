"""One rank of the placement matrix (gloo, CPU), for test_placement_matrix.py: ``job(spec)``
in the shared launch (_launch_run.py), or under torchrun with argv spec.json.

The spec names the integrations (all of them run in this one job). Every
reader of ``_placement.READERS`` is read through each as a user would, ``world=`` left
out; the rank records the ``input_ids`` of each micro-batch it trained on
(``<integration>/<reader>.r<rank>.npy``: micro-steps × micro batch × seq_len). Under the
Trainer it also evaluates each reader's eval form and records, on rank 0, the rows
``compute_metrics`` and ``predict`` received.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _placement import (
    ACCUMULATION,
    EVAL_MICRO,
    GLOBAL,
    MICRO,
    READERS,
    SEQ_LEN,
    SFT_LEN,
    STEPS,
    VOCAB,
    packed_sft,
)

import shardwise as sw  # noqa: E402
from shardwise.torch import collate  # noqa: E402


def _model() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SFT_LEN, n_embd=16,
                                      n_layer=2, n_head=2))


def _micro_batches(name: str, ds: Any, integration: str, collate: Any = collate) -> Any:
    """The loader a user writes for ``integration`` (accelerate: the torch one, iterated
    outside ``prepare``, as the README says)."""
    from torch.utils.data import DataLoader

    if integration == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        from shardwise.torchdata import batch_sampler
        if READERS[name].iterable:
            return StatefulDataLoader(ds, batch_size=MICRO, collate_fn=collate)
        bs = batch_sampler(ds, global_batch_size=GLOBAL, micro_batch_size=MICRO)
        return StatefulDataLoader(ds, batch_sampler=bs, collate_fn=collate)
    if READERS[name].iterable:
        return DataLoader(ds, batch_size=MICRO, collate_fn=collate)
    from shardwise.torch import loader
    return loader(ds, global_batch_size=GLOBAL, micro_batch_size=MICRO, collate_fn=collate)


def _numpy_batches(name: str, ds: Any) -> Any:
    """Without torch: sw.numpy_loader; an iterable reader places itself (a plain loop)."""
    if not READERS[name].iterable:
        return sw.numpy_loader(ds, global_batch_size=GLOBAL, micro_batch_size=MICRO)
    return _stacked(ds)


def _stacked(ds: Any) -> Any:
    rows: list[Any] = []
    for example in ds:
        rows.append(example)
        if len(rows) == MICRO:
            yield {"input_ids": np.stack([np.asarray(r["input_ids"]) for r in rows])}
            rows = []


def _olmo_batches(name: str, ds: Any, record: str) -> Any:
    """OLMo's data loader as its Trainer drives it; each rank batch split into its
    micro-steps as OLMo's train module splits it (rank_microbatch_size = MICRO rows)."""
    from shardwise.olmo import ShardwiseDataLoader

    seq = SFT_LEN if name == "PackedSFT" else SEQ_LEN
    dl = ShardwiseDataLoader(ds, global_batch_size=GLOBAL * seq, micro_batch_size=MICRO,
                             seq_len=seq, work_dir=Path(record) / "olmo-work")
    dl.reshuffle(1)
    for batch in dl:
        for a in range(ACCUMULATION):
            yield {"input_ids": batch["input_ids"][a * MICRO:(a + 1) * MICRO]}


def read(spec: dict[str, Any], integration: str) -> dict[str, np.ndarray]:
    """torch / torchdata / accelerate: ``STEPS × ACCUMULATION`` micro-batches per reader
    (accelerate: each trains a micro-step under ``accelerator.accumulate``)."""
    acc = model = opt = None
    collate_fn = collate
    if integration == "accelerate":
        from accelerate import Accelerator

        from shardwise.hf import collate as collate_fn
        acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        model, opt = acc.prepare(model, opt)
    elif not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    seen = {}
    for name, reader in READERS.items():
        rows = []
        ds = reader.make(spec["data"], True)
        fn = collate_fn
        if acc is not None and getattr(ds, "label_convention", None) != "next_token":
            from transformers import default_data_collator as fn  # records: HF's labels
        batches = (_numpy_batches(name, ds) if integration == "numpy" else
                   _olmo_batches(name, ds, spec["record"]) if integration == "olmo" else
                   _micro_batches(name, ds, integration, fn))
        for batch in batches:
            rows.append(np.asarray(batch["input_ids"]).copy())
            if acc is not None:
                with acc.accumulate(model):
                    acc.backward(model(**batch).loss)
                    opt.step()
                    opt.zero_grad()
            if len(rows) == STEPS * ACCUMULATION:
                break
        seen[name] = np.stack(rows)
    return seen


def lightning(spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """Lightning DDP (the launch's process group reused): ``STEPS`` steps of
    ``ACCUMULATION`` micro-steps on each reader, recording what ``training_step`` saw. A
    sampler-placed reader goes through ``shardwise.lightning.loader`` (with
    ``TrainedPosition``); an iterable one as its plain ``DataLoader`` (Lightning leaves
    iterable datasets alone, and the wrapper takes sampler-driven loaders only)."""
    import lightning as L
    from _lightning_run import TinyLM
    from torch.utils.data import DataLoader

    from shardwise.lightning import TrainedPosition, loader
    from shardwise.torch import loader as torch_loader

    seen = {}
    for name, reader in READERS.items():
        ds = reader.make(spec["data"], True)
        dl = (DataLoader(ds, batch_size=MICRO, collate_fn=collate) if reader.iterable else
              loader(torch_loader(ds, global_batch_size=GLOBAL, micro_batch_size=MICRO)))
        trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
                            strategy="ddp", max_steps=STEPS, max_epochs=-1,
                            accumulate_grad_batches=ACCUMULATION,
                            callbacks=[TrainedPosition()], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        model = TinyLM(VOCAB)
        trainer.fit(model, train_dataloaders=dl)
        seen[name] = np.stack(model.seen)
    return seen


def torchtitan(spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """torchtitan: a sampler-placed reader through ``ShardwiseDataLoader`` (built by its
    config, as titan's trainer builds it; a subclass reads the row's reader), an iterable
    one through titan's own ``ParallelAwareDataloader`` (it places itself)."""
    from dataclasses import dataclass

    from torchtitan.components.dataloader import ParallelAwareDataloader

    from shardwise.integrations.torchtitan import ShardwiseDataLoader

    class Reading(ShardwiseDataLoader):
        @dataclass(kw_only=True, slots=True)
        class Config(ShardwiseDataLoader.Config):
            pass

        reader: Any = None  # the row's reader

        def dataset(self, config: Any, seq_len: int) -> Any:
            return self.reader

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    seen = {}
    for name, reader in READERS.items():
        ds = reader.make(spec["data"], True)
        if reader.iterable:
            batches = (b["input_ids"] for b in ParallelAwareDataloader(
                ds, dp_rank=rank, dp_world_size=world, batch_size=MICRO, collate_fn=collate))
        else:
            Reading.reader = ds
            dl = Reading.Config().build(dp_world_size=world, dp_rank=rank, seq_len=SEQ_LEN,
                                        local_batch_size=MICRO)
            batches = (inputs["input"] for inputs, _ in dl)
        seen[name] = np.stack([next(batches).numpy().copy()
                               for _ in range(STEPS * ACCUMULATION)])
    return seen


def fabric(spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """Lightning Fabric DDP (the launch's process group reused): ``setup_dataloaders`` over
    litgpt's data module's loader (windows of ``seq_len + 1``) for a sampler-placed reader,
    over a plain ``DataLoader`` for an iterable one."""
    import lightning as L
    from torch.utils.data import DataLoader

    from shardwise.integrations.litgpt import ShardwiseData

    f = L.Fabric(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), strategy="ddp")
    f.launch()
    data = ShardwiseData()
    data.connect(batch_size=MICRO, max_seq_length=SEQ_LEN)
    seen = {}
    for name, reader in READERS.items():
        ds = reader.make(spec["data"], True)
        dl = f.setup_dataloaders(DataLoader(ds, batch_size=MICRO, collate_fn=collate)
                                 if reader.iterable else data.loader(ds))
        it = iter(dl)
        rows = []
        for _ in range(STEPS * ACCUMULATION):
            b = next(it)
            rows.append((b["input_ids"] if isinstance(b, dict) else b[:, :-1]).numpy().copy())
        seen[name] = np.stack(rows)
    return seen


def trainer(spec: dict[str, Any], trl: bool = False) -> dict[str, np.ndarray]:
    """ShardwiseTrainer (``trl``: TRL's SFTTrainer with the mixin): train ``STEPS`` steps on
    each reader, then evaluate and predict its eval form; rank 0 records what
    compute_metrics and predict received."""
    from transformers import PreTrainedTokenizerFast, TrainingArguments

    from shardwise.hf import ShardwiseTrainer, ShardwiseTrainerMixin

    if trl:
        from trl import SFTConfig, SFTTrainer

        class Base(ShardwiseTrainerMixin, SFTTrainer):
            pass
        sample = Path(__file__).resolve().parents[2] / "sample" / "tokenizer.json"
        extra: dict[str, Any] = {"processing_class": PreTrainedTokenizerFast(
            tokenizer_file=str(sample))}
        Args: Any = SFTConfig
        more: dict[str, Any] = {"bf16": False, "activation_checkpointing": False}
    else:
        Base, extra, Args, more = ShardwiseTrainer, {}, TrainingArguments, {}

    class Recording(Base):  # type: ignore[misc,valid-type]
        def compute_loss(self, model: Any, inputs: dict[str, Any], **kwargs: Any) -> Any:
            self.seen.append(inputs["input_ids"].numpy().copy())
            return super().compute_loss(model, inputs, **kwargs)

    metric_rows: list[np.ndarray] = []

    def metrics(p: Any) -> dict[str, float]:
        metric_rows.append(np.asarray(p.inputs))
        assert len(p.inputs) == len(p.label_ids) == len(p.predictions)
        return {"rows": float(len(p.inputs))}

    out, rank = {}, int(os.environ["RANK"])
    for name, reader in READERS.items():
        args = Args(
            output_dir=str(Path(spec["record"]) / f"out-{name}"),
            per_device_train_batch_size=MICRO, gradient_accumulation_steps=ACCUMULATION,
            per_device_eval_batch_size=EVAL_MICRO, max_steps=STEPS, save_strategy="no",
            learning_rate=1e-3, report_to=[], use_cpu=True, ddp_backend="gloo",
            disable_tqdm=True, dataloader_num_workers=0, include_for_metrics=["inputs"],
            logging_strategy="no", seed=0, **more)
        t = Recording(model=_model(), args=args, train_dataset=reader.make(spec["data"], True),
                      compute_metrics=metrics, **extra,
                      preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))
        t.seen = []
        t.train()
        out[name] = np.stack(t.seen)
        if reader.eval:
            metric_rows.clear()
            t.evaluate(reader.make(spec["data"], False))
            evaluated = np.concatenate(metric_rows)
            pred = t.predict(reader.make(spec["data"], False))
            if rank == 0:
                out[f"{name}.metrics"] = evaluated
                out[f"{name}.predict"] = np.asarray(pred.predictions)
                out[f"{name}.predict_labels"] = np.asarray(pred.label_ids)
    # a reader made for another world than the Trainer's is refused, naming the fix
    try:
        Recording(model=_model(), args=args, **extra,
                  train_dataset=packed_sft(spec["data"], True, world=sw.World.single())
                  ).get_train_dataloader()
        refused = "not refused"
    except Exception as e:  # the test names what was raised, if not the refusal
        refused = f"{type(e).__name__}: {e}"
    Path(spec["record"], f"refused.r{rank}.txt").write_text(refused)
    return out


def main(spec: dict[str, Any]) -> None:
    """Every integration of the spec in turn, each recording into its own directory; one
    that raises records its traceback there and the next one still runs."""
    rank = int(os.environ["RANK"])
    for integration in spec["integrations"]:
        record = Path(spec["record"]) / integration
        record.mkdir(exist_ok=True)
        one = {**spec, "record": str(record)}
        try:
            seen = (trainer(one, trl=integration == "trl") if integration in ("trainer", "trl")
                    else lightning(one) if integration == "lightning"
                    else torchtitan(one) if integration == "torchtitan"
                    else fabric(one) if integration == "fabric"
                    else read(one, integration))
        except Exception:
            (record / f"error.r{rank}.txt").write_text(traceback.format_exc())
            continue
        for key, rows in seen.items():
            np.save(record / f"{key}.r{rank}.npy", rows)


job = main


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
