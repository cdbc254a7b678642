"""TRL's SFTTrainer under :class:`~shardwise.hf.ShardwiseTrainerMixin`: shardwise readers
skip TRL's dataset preparation.

``SFTTrainer.__init__`` (TRL ≥ 1.0) accepts only datasets' ``Dataset`` / ``IterableDataset``
(a ``TypeError`` otherwise), reads one example to tell the dataset's kind, then tokenizes,
truncates and packs it (``_prepare_dataset``) and builds a padding collator. A shardwise
reader is already tokenized, packed and labelled — next-token targets with its loss mask
applied (ChatProcessor's records: the assistant turns only) — so under the mixin:

* ``SFTTrainer.__init__`` is given a one-row stand-in for each shardwise reader (it passes
  the type check and the sniffing, and nothing is prepared from it); the readers are put
  back as ``train_dataset`` / ``eval_dataset`` when it returns;
* ``_prepare_dataset`` returns a reader (and a stand-in) unchanged — ``evaluate(reader)``
  too — so nothing is tokenized, truncated or packed again;
* the collator is the mixin's (:func:`shardwise.hf.collate` for shardwise's examples), so
  TRL's loss — its fused LM head, which scores ``shift_labels`` as given — is the masked
  next-token cross-entropy of the reader's labels, and ``position_ids`` reach the model;
* the SFTConfig options that TRL's preparation implements, which a reader would silently
  not get, are refused naming what shardwise does instead (:data:`PREPARATION_OPTIONS`).

Datasets that are not shardwise readers (datasets' own) go through TRL as usual.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from shardwise.checkpoint import Configured
from shardwise.errors import ConfigError

# SFTConfig option -> (the value that asks TRL's preparation for it, what to do instead)
PREPARATION_OPTIONS = {
    "packing": (True, "a TokenDataset is packed already; pack SFT records with "
                "sw.PackedSFT(records, seq_len=...)"),
    "eval_packing": (True, "pack the eval records with sw.PackedSFT"),
    "padding_free": (True, "shardwise rows are padded to seq_len (PackedSFT) or full "
                     "windows (TokenDataset); position_ids restart per record"),
    "assistant_only_loss": (True, "the loss mask is in the reader's labels: "
                            "sw.ChatProcessor trains on assistant turns only (train_on=)"),
    "completion_only_loss": (True, "the loss mask is in the reader's labels: "
                             "sw.ChatProcessor(input_key=..., label_key=...) trains on the "
                             "completion only"),
}


class WithPositions:
    """A collator whose batches TRL can count: TRL's ``compute_loss`` needs
    ``attention_mask`` or ``position_ids``, and records (a RecordStream's, in Hugging Face's
    convention) may carry neither; they get ``position_ids`` ``0 … L-1`` — what the model
    assumes without them, so the forward is unchanged."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, rows: Any) -> Any:
        batch = self.collate(rows)
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        if ids is not None and "attention_mask" not in batch and "position_ids" not in batch:
            import torch

            batch["position_ids"] = torch.arange(ids.shape[-1]).expand_as(ids)
        return batch


def is_sft_trainer(cls: type) -> bool:
    """Whether TRL's ``SFTTrainer`` is among ``cls``'s bases (TRL is not imported here)."""
    return any(c.__name__ == "SFTTrainer" and c.__module__.startswith("trl.")
               for c in cls.__mro__)


def is_reader(ds: Any) -> bool:
    """A shardwise reader, or a dict of eval datasets holding one."""
    if isinstance(ds, dict):
        return any(is_reader(v) for v in ds.values())
    return isinstance(ds, Configured)


@dataclass
class StandIns:
    """The keyword arguments ``SFTTrainer.__init__`` gets, with each shardwise reader
    replaced by a one-row stand-in, and the readers to put back."""

    kwargs: dict[str, Any]
    readers: dict[str, Any] = field(default_factory=dict)
    made: list[Any] = field(default_factory=list)

    def passes(self, ds: Any) -> bool:
        """Whether ``_prepare_dataset`` must return ``ds`` unchanged."""
        return is_reader(ds) or any(ds is s for s in self.made)

    def restore(self, trainer: Any) -> None:
        """Put the readers back on the trainer that ``SFTTrainer.__init__`` built."""
        from transformers.trainer_utils import has_length

        for name, ds in self.readers.items():
            setattr(trainer, name, ds)
        train = self.readers.get("train_dataset")
        if train is not None and not has_length(train) and trainer.args.max_steps <= 0:
            raise ConfigError(f"{type(train).__name__} has no length (it is iterable), so "
                              "the number of training steps is unknown: set max_steps in "
                              "the SFTConfig")


def stand_ins(trainer_cls: type, init: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              collator: Any) -> StandIns | None:
    """For an SFTTrainer given a shardwise reader: its ``__init__`` arguments with stand-ins
    (``init``: that ``__init__``, bound), the mixin's ``collator`` unless one was given;
    else None (nothing to do)."""
    if not is_sft_trainer(trainer_cls):
        return None
    bound = inspect.signature(init).bind(*args, **kwargs)
    kw: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = inspect.signature(init).parameters[name].kind
        kw.update(value if kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    if not (is_reader(kw.get("train_dataset")) or is_reader(kw.get("eval_dataset"))):
        return None
    refuse_preparation_options(kw.get("args"), kw.get("formatting_func"))
    out = StandIns(kw)
    for name in ("train_dataset", "eval_dataset"):
        ds = kw.get(name)
        if ds is None or not is_reader(ds):
            continue
        out.readers[name] = ds
        kw[name] = ({k: out_stand_in(out) for k in ds} if isinstance(ds, dict)
                    else out_stand_in(out))
    if kw.get("data_collator") is None:
        kw["data_collator"] = collator
    return out


def out_stand_in(out: StandIns) -> Any:
    """A one-row ``datasets.Dataset`` TRL can type-check and sniff (token ids, no text, no
    image, no prompt/completion columns); recorded in ``out`` so it is never prepared."""
    from datasets import Dataset

    ds = Dataset.from_dict({"input_ids": [[0]]})
    out.made.append(ds)
    return ds


def refuse_preparation_options(args: Any, formatting_func: Any) -> None:
    """ConfigError for each SFTConfig option TRL's dataset preparation would implement."""
    asked = [(k, why) for k, (v, why) in PREPARATION_OPTIONS.items()
             if args is not None and getattr(args, k, None) == v]
    if formatting_func is not None:
        asked.append(("formatting_func", "the reader's records are processed at build "
                      "time (sw.ChatProcessor, a build's map_fn)"))
    if asked:
        said = "; ".join(f"{k}: {why}" for k, why in asked)
        raise ConfigError(f"SFTTrainer would apply {[k for k, _ in asked]} while preparing "
                          "a dataset, and a shardwise reader is not prepared by TRL (it is "
                          f"tokenized, packed and labelled already): drop them — {said}")


class SFTHooks:
    """The TRL part of :class:`~shardwise.hf.ShardwiseTrainerMixin` (one of its bases):
    how the trainer is constructed, TRL's ``_prepare_dataset`` hook, and the collator TRL's
    loss can count (see the module docs). Nothing here acts under a plain Trainer."""

    _sw_trl: StandIns | None = None

    def _sw_construct(self, init: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      collator: Any) -> None:
        """Call the next ``__init__`` (``init``), with stand-ins under an SFTTrainer."""
        self._sw_trl = stand_ins(type(self), init, args, kwargs, collator)
        if self._sw_trl is None:
            init(*args, **kwargs)
        else:
            init(**self._sw_trl.kwargs)
            self._sw_trl.restore(self)

    def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        """TRL's hook: a shardwise reader is tokenized, packed and labelled already, and
        is returned as it is; other datasets are prepared by TRL."""
        if self._sw_trl is not None and self._sw_trl.passes(dataset):
            return dataset
        return super()._prepare_dataset(dataset, *args, **kwargs)  # type: ignore[misc]

    def _sw_for_trl(self, collator: Any) -> Any:
        return WithPositions(collator) if is_sft_trainer(type(self)) else collator


__all__ = ["PREPARATION_OPTIONS", "SFTHooks", "StandIns", "WithPositions", "is_reader",
           "is_sft_trainer", "refuse_preparation_options", "stand_ins"]
