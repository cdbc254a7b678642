"""Megatron-LM's dataset vocabulary over shardwise readers: swap the dataset and loader calls.

A Megatron-style ``pretrain_gpt.py`` keeps its arguments and its training loop::

    from shardwise.megatron import (build_train_valid_test_datasets,
                                    build_pretraining_data_loader)
    train, valid, test = build_train_valid_test_datasets(
        "0.3 data/web_text_document 0.7 cache/code", split="969,30,1",
        seq_length=2048, seed=1234, reset_position_ids=True, eod_mask_loss=True)
    train_loader = build_pretraining_data_loader(train, args.consumed_train_samples,
                                                 micro_batch_size=4)

* ``data_path``: Megatron's ``--data-path`` list (``"0.3 A 0.7 B"``, its split list, or
  unweighted prefixes, weighted by size); each entry a shardwise cache or a Megatron prefix.
* ``split``: Megatron's rule (:func:`split_ranges`): split ``k`` of a dataset of ``N``
  documents is documents ``[round(lo·N), round(hi·N))`` of the normalized bookends, so a
  shardwise cache (one sequence per document) is split exactly as Megatron splits it.
* examples: windows of ``seq_length + 1`` tokens packed from the documents shuffled per
  epoch (:class:`~shardwise.read.tokens.dataset.TokenDataset` ``shuffle="document"``,
  Megatron's layout), reading across chunk edges: no window is lost where a chunk ends.
  Several datasets are mixed by :class:`~shardwise.read.compose.blend.Blend`.
* samples carry Megatron's keys and masks (:func:`ltor_masks_and_position_ids`, the
  semantics of megatron-core's ``_get_ltor_masks_and_position_ids``); ``labels`` are
  valid token ids (0 where ``loss_mask`` is 0), as Megatron's loss expects.
* the loader (:mod:`shardwise.integrations.megatron_loader`) is
  :func:`shardwise.torch.loader`: ``consumed_samples`` is its position, so resuming from a
  checkpoint's ``consumed_train_samples`` continues exactly;
  :func:`~shardwise.integrations.megatron_loader.global_batch_size_at` is Megatron's
  ``--rampup-batch-size`` arithmetic.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import ConfigError
from shardwise.format.chunk import IGNORE_INDEX
from shardwise.read.compose.blend import Blend
from shardwise.read.examples import Output
from shardwise.read.tokens.dataset import TokenDataset
from shardwise.storage.cache import Cache
from shardwise.storage.cache_range import DocumentRange
from shardwise.storage.opening import open_cache

SPLITS = ("train", "valid", "test")


# -- data_path and split ----------------------------------------------------------------
def get_blend_from_list(data_path: str | Sequence[str] | None
                        ) -> tuple[list[str], list[float] | None] | None:
    """Megatron's ``--data-path`` → ``(prefixes, weights or None)``, as megatron-core's
    ``get_blend_from_list``; a string is split on whitespace::

        "0.3 A 0.7 B"  →  (["A", "B"], [0.3, 0.7])        "A B C"  →  (["A", "B", "C"], None)
    """
    if data_path is None:
        return None
    items = data_path.split() if isinstance(data_path, str) else [str(x) for x in data_path]
    if not items:
        raise ConfigError("data_path is empty; give prefixes, or weight prefix pairs")
    if len(items) % 2 == 0:
        try:
            weights = [float(w) for w in items[0::2]]
        except ValueError:
            weights = None
        if weights is not None:
            if any(not w >= 0 for w in weights) or not sum(weights) > 0:
                raise ConfigError(f"data_path weights must be >= 0 with a positive sum, got "
                                  f"{weights}")
            return [p.strip() for p in items[1::2]], weights
    return [p.strip() for p in items], None


def parse_split(split: str) -> list[float]:
    """``"969,30,1"`` → normalized train/valid/test ratios (megatron-core's
    ``parse_and_normalize_split``: the numbers in the string, padded with zeros)."""
    parts = [float(x) for x in re.findall(r"[.0-9]+", split)]
    if len(parts) > len(SPLITS) or not parts or not sum(parts) > 0:
        raise ConfigError(f"split must be up to {len(SPLITS)} non-negative numbers with a "
                          f"positive sum (train,valid,test like '969,30,1'), got {split!r}")
    parts += [0.0] * (len(SPLITS) - len(parts))
    total = float(np.sum(np.asarray(parts, dtype=np.float64)))
    return (np.asarray(parts, dtype=np.float64) / total).tolist()


def split_ranges(num_documents: int, split: str) -> list[tuple[int, int] | None]:
    """Each split's documents ``[beg, end)`` (None for an empty split), by Megatron's rule::

        split "969,30,1", 1000 documents → [(0, 969), (969, 999), (999, 1000)]
    """
    bounds = np.cumsum([0.0, *parse_split(split)]).tolist()
    out: list[tuple[int, int] | None] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi <= lo:
            out.append(None)
            continue
        out.append((int(round(lo * float(num_documents))),
                    int(round(hi * float(num_documents)))))
    return out


# -- masks ------------------------------------------------------------------------------
def ltor_masks_and_position_ids(tokens: npt.NDArray[np.integer], eod_token: int | None, *,
                                reset_position_ids: bool, reset_attention_mask: bool,
                                eod_mask_loss: bool, create_attention_mask: bool
                                ) -> tuple[npt.NDArray[np.bool_] | None,
                                           npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Megatron's masks for a ``[B, L]`` batch of inputs, vectorised: a document ends
    *at* an end-of-document token, so the next token starts at position 0 and cannot
    attend back. ``attention_mask`` is ``[B, 1, L, L]``, True where attention is masked::

        tokens        5 6 E 7 8      (E = eod_token)
        position_ids  0 1 2 0 1      (reset_position_ids)
        loss_mask     1 1 0 1 1      (eod_mask_loss)
    """
    B, L = tokens.shape
    pos = np.arange(L, dtype=np.int64)
    is_eod = (tokens == eod_token) if eod_token is not None else np.zeros((B, L), bool)
    loss_mask = np.ones((B, L), dtype=np.float32)
    if eod_mask_loss:
        loss_mask[is_eod] = 0.0
    # where each position's document starts: one past the last end-of-document before it
    start = np.zeros((B, L), dtype=np.int64)
    start[:, 1:] = np.maximum.accumulate(np.where(is_eod, pos + 1, 0), axis=1)[:, :-1]
    position_ids = (pos[None, :] - start) if reset_position_ids else np.tile(pos, (B, 1))
    if not create_attention_mask:
        return None, loss_mask, position_ids
    masked = np.broadcast_to(pos[None, :] > pos[:, None], (B, L, L)).copy()  # causal
    if reset_attention_mask:
        masked |= pos[None, None, :] < start[:, :, None]  # keys before the query's document
    return masked[:, None], loss_mask, position_ids


# -- datasets ---------------------------------------------------------------------------
class GPTDataset:
    """Megatron's sample dicts (``tokens``, ``labels``, ``loss_mask``, ``position_ids``,
    and ``attention_mask`` when ``create_attention_mask``) over a map-style shardwise
    token dataset (a TokenDataset or a Blend of them); index, length, order, resume and
    locality are the inner dataset's. ``output``: ``Output(dtype="int32")`` gives int32
    ``tokens``, ``labels`` and ``position_ids`` (Megatron's sample dict has no compact form:
    its ``get_batch`` reads these keys as they are)."""

    def __init__(self, dataset: Any, *, split: str = "train", eod_token: int | None = None,
                 reset_position_ids: bool = False, reset_attention_mask: bool = False,
                 eod_mask_loss: bool = False, create_attention_mask: bool = True,
                 output: Output | None = None) -> None:
        self.dataset, self.split = dataset, split
        self.output = Output.of(output)
        if self.output.compact:
            raise ConfigError("Megatron's sample dicts have no compact form (its get_batch "
                              "reads tokens, labels, loss_mask and position_ids): use "
                              "output=Output(dtype='int32'), or shardwise.torch.loader with "
                              "compact batches and expand() in your own get_batch")
        self.flags = {"reset_position_ids": bool(reset_position_ids),
                      "reset_attention_mask": bool(reset_attention_mask),
                      "eod_mask_loss": bool(eod_mask_loss),
                      "create_attention_mask": bool(create_attention_mask)}
        needs_eod = reset_position_ids or reset_attention_mask or eod_mask_loss
        if needs_eod and eod_token is None:
            raise ConfigError("reset_position_ids, reset_attention_mask and eod_mask_loss "
                              "find documents by their end-of-document token, and none is "
                              "known: pass eod_token= (the tokenizer's eod id), or build the "
                              "cache with a tokenizer that has one")
        self.eod_token = eod_token

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        return f"GPTDataset({self.split}, {self.dataset!r})"

    def __getitem__(self, index: int) -> dict[str, npt.NDArray[Any]]:
        return {k: v[0] for k, v in self.__getitems__([int(index)]).items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, npt.NDArray[Any]]:
        """A micro-batch, stacked; padding rows (index -1) have ``loss_mask`` 0."""
        b = self.dataset.__getitems__(indices)
        tokens = b["input_ids"]
        attention, loss_mask, position_ids = ltor_masks_and_position_ids(
            tokens, self.eod_token, **self.flags)
        loss_mask *= b["loss_mask"]
        labels = b["labels"]  # next-token ids; IGNORE_INDEX ("no target") becomes 0
        out = {"tokens": tokens, "labels": np.where(labels == IGNORE_INDEX, 0, labels),
               "loss_mask": loss_mask, "position_ids": position_ids}
        if attention is not None:
            out["attention_mask"] = attention
        if not self.output.is_default:
            for k in ("tokens", "labels", "position_ids"):
                out[k] = out[k].astype(self.output.dtype_name)
        return out

    # -- what the loader asks of a dataset: identity, resume and prefetch, the inner one's
    def state_config(self) -> dict[str, Any]:
        inner = (self.dataset.state_config() if hasattr(self.dataset, "state_config")
                 else {"len": len(self.dataset)})
        return {**inner, "megatron": {**self.flags, "eod_token": self.eod_token}}

    def loader_state_extra(self, consumed: int) -> dict[str, Any]:
        f = getattr(self.dataset, "loader_state_extra", None)
        return f(consumed) if f is not None else {}

    def restore_loader_state(self, consumed: int, extra: dict[str, Any]) -> None:
        f = getattr(self.dataset, "restore_loader_state", None)
        if f is not None:
            f(consumed, extra)

    def prefetch(self, indices: list[int]) -> bool | None:
        f = getattr(self.dataset, "prefetch", None)
        return f(indices) if f is not None else None

    @property
    def pads(self) -> bool:
        """Whether index -1 gives a masked padding row (an eval pass needs it)."""
        return bool(getattr(self.dataset, "pads", False))

    def drops(self) -> list[Any]:
        """What the inner dataset leaves out by design (a last partial window, …)."""
        f = getattr(self.dataset, "drops", None)
        return list(f()) if callable(f) else []


def build_train_valid_test_datasets(
        data_path: str | Sequence[str], *, seq_length: int, split: str = "969,30,1",
        seed: int = 1234, eod_token: int | None = None, reset_position_ids: bool = False,
        reset_attention_mask: bool = False, eod_mask_loss: bool = False,
        create_attention_mask: bool = True, shuffle: str = "document",
        drop_last_partial_validation_sequence: bool = True,
        plan_dir: str | os.PathLike[str] | None = None,
        output: Output | None = None) -> list[GPTDataset | None]:
    """``[train, valid, test]`` (None for an empty split) from Megatron's ``--data-path``
    and ``--split``: each dataset is cut into document runs by :func:`split_ranges`, each
    run packed into windows (``shuffle``: TokenDataset's, ``"document"`` by default), and
    several datasets blended by weight (by number of windows when unweighted).
    ``drop_last_partial_validation_sequence=False`` keeps the valid split's last, short
    window (padded, masked), as a full-validation pass needs. ``output``: the sample
    dicts' dtype (:class:`GPTDataset`)."""
    blend = get_blend_from_list(data_path)
    if blend is None:
        raise ConfigError("data_path is None; give Megatron's --data-path list (prefixes or "
                          "weight prefix pairs: caches or Megatron prefixes)")
    prefixes, weights = blend
    caches = [open_cache(p) for p in prefixes]
    eod = eod_token if eod_token is not None else _common_eod(caches)
    per_split: list[list[TokenDataset]] = [[] for _ in SPLITS]
    for cache in caches:
        for k, rng in enumerate(split_ranges(cache.num_documents, split)):
            if rng is not None:
                drop = drop_last_partial_validation_sequence or SPLITS[k] != "valid"
                per_split[k].append(_split_dataset(cache, rng, SPLITS[k], seq_length, seed,
                                                   shuffle, drop, plan_dir))
    out: list[GPTDataset | None] = []
    for k, parts in enumerate(per_split):
        if not parts:
            out.append(None)
            continue
        inner: Any = parts[0]
        if len(parts) > 1:
            w = weights if weights is not None else [float(len(d)) for d in parts]
            inner = Blend(parts, w, seed=seed, names=[f"{j}:{p}" for j, p in enumerate(prefixes)])
        out.append(GPTDataset(inner, split=SPLITS[k], eod_token=eod,
                              reset_position_ids=reset_position_ids,
                              reset_attention_mask=reset_attention_mask,
                              eod_mask_loss=eod_mask_loss,
                              create_attention_mask=create_attention_mask,
                              output=output))
    return out


def _common_eod(caches: list[Cache]) -> int | None:
    ids = {c.eod_id for c in caches if c.eod_id is not None}
    if len(ids) > 1:
        raise ConfigError(f"the datasets' end-of-document ids differ ({sorted(ids)}): "
                          "blend datasets of one tokenizer, or pass eod_token=")
    return ids.pop() if ids else None


def _split_dataset(cache: Cache, rng: tuple[int, int], name: str, seq_length: int,
                   seed: int, shuffle: str, drop_last: bool, plan_dir: Any) -> TokenDataset:
    beg, end = rng
    part = cache if (beg, end) == (0, cache.num_documents) else DocumentRange(cache, beg, end)
    try:
        return TokenDataset(part, seq_len=seq_length, seed=seed, shuffle=shuffle,
                            drop_last=drop_last, plan_dir=plan_dir)
    except ConfigError as e:
        raise ConfigError(f"the {name} split of {cache.location} (documents [{beg}, {end}), "
                          f"{part.num_tokens} tokens) holds no window of seq_length + 1 = "
                          f"{seq_length + 1} tokens; give it more documents in --split, "
                          f"or lower seq_length ({e})") from None


__all__ = ["GPTDataset", "build_train_valid_test_datasets", "get_blend_from_list",
           "ltor_masks_and_position_ids", "parse_split", "split_ranges"]
