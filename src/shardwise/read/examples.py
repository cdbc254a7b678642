"""The example layout every example reader emits, and its one label convention.

TokenDataset, StreamDataset, PackedSFT and a Blend of them hand a training step dicts of
arrays with the same keys and meaning::

    input_ids     [L] int64    the tokens the model sees
    labels        [L] int64    next-token targets: labels[t] is the token that follows
                               input_ids[t]; IGNORE_INDEX (-100) where no loss is taken
    loss_mask     [L] float32  1.0 exactly where labels != IGNORE_INDEX
    position_ids  [L] int64    (restarting at document starts when asked)
    cu_seqlens, max_seqlen     packed-attention boundaries, when asked for

    window  7 8 9 3 4   ->   input_ids 7 8 9 3   labels 8 9 3 4   loss_mask 1 1 1 1

This is Megatron's layout (tokens / labels / loss_mask) with Hugging Face's ignore index,
so a loss is ``cross_entropy(logits, labels, ignore_index=-100)`` with no shift. Framework
adapters convert at the edge (``shardwise.hf`` passes these labels as ``shift_labels``;
``shardwise.megatron`` turns -100 into a valid id under a zero loss mask).

*Records* — what RecordStream yields, what ChatProcessor makes, what PackedSFT packs — keep
Hugging Face's per-token convention (a record's ``labels[t]`` is token ``t``'s own label);
PackedSFT shifts them when it packs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError
from shardwise.format.chunk import IGNORE_INDEX

NEXT_TOKEN = "next_token"  # the ``label_convention`` of every example reader


def ignore_unmasked(labels: npt.NDArray[np.int64], loss_mask: npt.NDArray[np.floating[Any]]
                    ) -> npt.NDArray[np.int64]:
    """Set ``labels`` to IGNORE_INDEX wherever ``loss_mask`` is 0 (in place; returned)."""
    labels[loss_mask == 0] = IGNORE_INDEX
    return labels


def check_same_layout(parts: list[Any], names: list[str]) -> None:
    """Refuse to mix readers whose examples disagree in label convention or keys (a Blend
    of a next-token reader and an unshifted one would train on both targets at once)."""
    conventions = {n: getattr(p, "label_convention", None) for p, n in zip(parts, names,
                                                                         strict=True)}
    known = {c for c in conventions.values() if c is not None}
    if len(known) > 1:  # a part that declares none (a user's dataset) is taken as it is
        raise ConfigError(f"these parts disagree on what 'labels' means: {conventions}; "
                          f"every part must emit {NEXT_TOKEN!r} labels (shardwise readers "
                          "do; wrap a foreign dataset to shift its labels and set "
                          "label_convention = 'next_token')")
    from shardwise.read.rows import own_example

    firsts = {n: own_example(p, 0) for p, n in zip(parts, names, strict=True)
              if hasattr(p, "__getitem__") and hasattr(p, "__len__") and len(p)}
    keys = {n: sorted(x) for n, x in firsts.items() if isinstance(x, Mapping)}
    if len({tuple(k) for k in keys.values()}) > 1:
        raise ConfigError(f"these parts make examples with different keys: {keys}; build "
                          "them with the same options (reset_position_ids, cu_seqlens, ...)")
