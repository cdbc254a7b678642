"""Batches as torch tensors: shardwise's collate, and the compact form's expansion.

:func:`collate` turns a shardwise micro-batch into tensors without a copy; :func:`expand`
turns a compact batch (:class:`~shardwise.read.examples.Output`) back into the full
layout on whatever device it is on (numpy's twin: :func:`shardwise.read.examples.expand`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardwise.errors import MissingExtraError
from shardwise.format.chunk import IGNORE_INDEX
from shardwise.read.examples import FULL_KEYS
from shardwise.read.rows import stacked

try:
    import torch
    from torch.utils.data._utils.collate import default_collate
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise MissingExtraError("shardwise.torch needs PyTorch: pip install 'shardwise[torch]'"
                            ) from e


def collate(data: Any) -> Any:
    """A micro-batch → a dict of tensors. A shardwise batch (``get_batch``'s dict, or the
    :class:`~shardwise.read.rows.Rows` ``__getitems__`` returns) is converted without a
    copy; anything else (a list of examples) goes to torch's ``default_collate``."""
    batch = stacked(data)
    if batch is not None:
        return {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    return default_collate(data)


def expand(batch: Any, dtype: Any = None) -> Any:
    """A compact batch (``output=shardwise.Output(compact=True)``) in the full layout, on
    the batch's device: ``batch = expand(batch)`` after moving it there. The same keys and
    values as the default form (``dtype``: of the token tensors, default int64); a full
    batch is returned unchanged. numpy's twin: :func:`shardwise.read.examples.expand`."""
    if "tokens" not in batch:
        return batch
    dtype = torch.int64 if dtype is None else dtype
    tokens = batch["tokens"]
    L = tokens.shape[-1] - 1
    labels = tokens[..., 1:].to(dtype)
    mask = batch.get("loss_mask")
    if mask is None:
        loss_mask = torch.ones(labels.shape, dtype=torch.float32, device=tokens.device)
    else:
        loss_mask = mask.to(torch.float32)
        labels.masked_fill_(mask == 0, IGNORE_INDEX)
    pos = batch.get("position_ids")
    positions = (torch.arange(L, dtype=dtype, device=tokens.device).expand(labels.shape)
                 .contiguous() if pos is None else pos.to(dtype))
    out = {"input_ids": tokens[..., :L].to(dtype), "labels": labels, "loss_mask": loss_mask,
           "position_ids": positions}
    out.update((k, v) for k, v in batch.items() if k not in ("tokens", *FULL_KEYS))
    return out


def pin(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in batch.items()}
    return batch
