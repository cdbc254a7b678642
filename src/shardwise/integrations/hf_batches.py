"""Hugging Face causal LMs' inputs from shardwise batches (the Trainer's collator).

shardwise's labels are next-token targets; a transformers model takes ``labels`` in HF's
unshifted convention, or the targets as ``shift_labels`` (``ForCausalLMLoss``): both are
passed (:mod:`shardwise.integrations.hf`).
"""

from __future__ import annotations

from typing import Any

from shardwise.format.chunk import IGNORE_INDEX
from shardwise.integrations.torch_batches import collate as torch_collate

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised only without the extra
    from shardwise.errors import MissingExtraError

    raise MissingExtraError("shardwise.hf needs transformers and accelerate: "
                            "pip install 'shardwise[hf]'") from e

MODEL_KEYS = ("input_ids", "labels", "shift_labels", "position_ids", "attention_mask")


def collate(data: Any) -> dict[str, torch.Tensor]:
    """A shardwise micro-batch → the inputs of a transformers causal LM (see module docs)::

        input_ids      7    8    9    3         shardwise labels  8 9 3 4, loss_mask 1 1 0 1
        shift_labels   8    9 -100    4         (the targets, as ForCausalLMLoss takes them)
        labels      -100    8    9 -100         (HF's unshifted convention)

    A compact batch (:class:`~shardwise.read.examples.Output`) is passed on as it is: the
    Trainer expands it on the device (:meth:`ShardwiseTrainerMixin._prepare_inputs`).
    """
    batch = torch_collate(data)
    return batch if "tokens" in batch else model_inputs(batch)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A shardwise batch (full form) → a causal LM's inputs (see :func:`collate`)."""
    out = {k: v for k, v in batch.items() if k in MODEL_KEYS}
    if "labels" in batch:
        shift = batch["labels"].clone()
        if "loss_mask" in batch:
            shift[batch["loss_mask"] == 0] = IGNORE_INDEX
        labels = torch.full_like(shift, IGNORE_INDEX)
        labels[..., 1:] = shift[..., :-1]
        out["labels"], out["shift_labels"] = labels, shift
    return out
