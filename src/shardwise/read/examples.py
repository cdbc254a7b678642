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

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.choice import Choice
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


# -- the output form: what a reader hands over (and what crosses a worker boundary) ------

FULL_KEYS = ("input_ids", "labels", "loss_mask", "position_ids")
OPTIONAL = ("loss_mask", "position_ids")  # the compact keys carried only when not trivial


class Dtype(Choice):
    """The integer type of token arrays: ``int64`` (torch's default index type),
    ``int32`` (JAX's default; half the bytes), or ``stored``: the cache's own dtype
    (uint16 for vocabularies under 65,536: a compact batch then holds the cache's bytes)."""

    __option__ = "Output.dtype"

    INT64 = "int64"
    INT32 = "int32"
    STORED = "stored"


@dataclass(frozen=True)
class Output:
    """The form of a reader's examples: ``Output()`` is the layout above, unchanged.

    ``dtype``: of ``input_ids``, ``labels`` and ``position_ids`` (``"int32"`` for JAX).
    ``compact=True`` hands over only what the model needs, for a DataLoader worker to send
    across processes (2 bytes a token from a uint16 cache, against 28 in full)::

        tokens        [L + 1]  the window (input_ids, then the last label), in ``dtype``
        loss_mask     [L] uint8   only when some label of the batch is masked
        position_ids  [L]         only when positions restart (documents, packed SFT)
        cu_seqlens, max_seqlen    as in the full form, when asked for

    One line on the device restores the full layout, same keys and values:
    ``batch = shardwise.torch.expand(batch)`` (numpy: :func:`expand`). The form changes no
    data, so it is not part of a reader's order or fingerprint. ``tokens[t + 1]`` where
    ``labels[t]`` is masked may be 0 (a padding row's, a masked last label's).
    """

    dtype: Dtype | str = Dtype.INT64
    compact: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", Dtype.parse(self.dtype))
        if not isinstance(self.compact, bool):
            raise ConfigError(f"Output.compact must be True or False, got {self.compact!r}")
        if self.dtype is Dtype.STORED and not self.compact:
            raise ConfigError("Output(dtype='stored') needs compact=True: the full form's "
                              "labels hold -100, which an unsigned cache dtype cannot; use "
                              "dtype='int32' for a smaller full form")

    @classmethod
    def of(cls, value: Output | None) -> Output:
        """A reader's ``output=`` argument (None: the default form)."""
        if value is None:
            return DEFAULT_OUTPUT
        if not isinstance(value, Output):
            raise ConfigError(f"output must be a shardwise.Output, got {value!r}; e.g. "
                              "output=shardwise.Output(dtype='int32', compact=True)")
        return value

    @property
    def is_default(self) -> bool:
        return self is DEFAULT_OUTPUT or self == DEFAULT_OUTPUT  # ``is``: asked per batch

    @property
    def dtype_name(self) -> str:
        """``dtype``'s value (``"int64"``, ``"int32"``, ``"stored"``)."""
        return Dtype.parse(self.dtype).value

    def token_dtype(self, stored: npt.DTypeLike) -> np.dtype[Any]:
        return np.dtype(stored if self.dtype is Dtype.STORED else self.dtype_name)

    def shape(self, batch: Mapping[str, npt.NDArray[Any]], stored: npt.DTypeLike,
              keep: Collection[str] = (), check: bool = False) -> dict[str, npt.NDArray[Any]]:
        """``batch`` (the full form, rows stacked or one example) in this form. ``keep``:
        optional compact keys carried even when trivial (a reader yielding single examples
        keeps its keys the same from row to row, so they collate). ``check``: refuse labels
        that are not the next input (a record's own labels; a window's always are)."""
        if self.is_default:
            return dict(batch)
        if not self.compact:
            return {k: (v.astype(self.dtype_name) if k in _TOKEN_KEYS else v)
                    for k, v in batch.items()}
        if check:
            _check_next_token(batch)
        return _compact(batch, self.token_dtype(stored), keep)


DEFAULT_OUTPUT = Output()
_TOKEN_KEYS = ("input_ids", "labels", "position_ids")


def _check_next_token(batch: Mapping[str, npt.NDArray[Any]]) -> None:
    labels, ids = batch["labels"][..., :-1], batch["input_ids"][..., 1:]
    bad = (labels != IGNORE_INDEX) & (labels != ids)
    if bad.any():
        where = tuple(int(x[0]) for x in np.nonzero(bad))
        raise ConfigError(f"Output(compact=True) derives labels from the next token, but at "
                          f"{where} the label is {int(labels[where])} and the next token "
                          f"{int(ids[where])}: these records carry labels of their own; "
                          "read them with compact=False")


def _compact(batch: Mapping[str, npt.NDArray[Any]], dtype: np.dtype[Any],
             keep: Collection[str]) -> dict[str, npt.NDArray[Any]]:
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["loss_mask"]
    L = ids.shape[-1]
    tokens = np.empty((*ids.shape[:-1], L + 1), dtype=dtype)
    tokens[..., :L] = ids
    last = labels[..., -1]
    tokens[..., L] = np.where(last == IGNORE_INDEX, 0, last) if L else 0
    out: dict[str, npt.NDArray[Any]] = {"tokens": tokens}
    if "loss_mask" in keep or not mask.all():
        out["loss_mask"] = (mask != 0).view(np.uint8)
    pos = batch["position_ids"]
    if "position_ids" in keep or not (pos == np.arange(L)).all():
        out["position_ids"] = pos.astype(dtype if dtype.kind == "i" else np.int32)
    out.update((k, v) for k, v in batch.items() if k not in FULL_KEYS)
    return out


def with_output(reader: Any, output: Output | None) -> Any:
    """``reader`` handing over ``output``'s form: itself when it already does (or
    ``output`` is None), else a shallow copy (the same order, caches and position) — how
    an integration's ``output=`` reaches the reader its workers run."""
    if output is None or getattr(reader, "output", None) == output:
        return reader
    if not hasattr(reader, "output"):
        raise ConfigError(f"output= shapes shardwise readers' examples, and "
                          f"{type(reader).__name__} is not one; leave output out (or make "
                          "its examples in the form you want)")
    shaped = copy.copy(reader)
    shaped.output = Output.of(output)
    return shaped


def expand(batch: Mapping[str, npt.NDArray[Any]], dtype: npt.DTypeLike = np.int64
           ) -> dict[str, npt.NDArray[Any]]:
    """A compact batch (:class:`Output`) in the full layout, numpy (a full one unchanged):
    ``input_ids``, ``labels`` (-100 where masked), ``loss_mask`` float32, ``position_ids``.

        tokens 7 8 9 3 4  ->  input_ids 7 8 9 3   labels 8 9 3 4   loss_mask 1 1 1 1
    """
    if "tokens" not in batch:
        return dict(batch)
    tokens = batch["tokens"]
    L = tokens.shape[-1] - 1
    labels = tokens[..., 1:].astype(dtype)
    mask = batch.get("loss_mask")
    if mask is None:
        loss_mask = np.ones(labels.shape, dtype=np.float32)
    else:
        loss_mask = mask.astype(np.float32)
        labels[mask == 0] = IGNORE_INDEX
    pos = batch.get("position_ids")
    out = {"input_ids": tokens[..., :L].astype(dtype), "labels": labels,
           "loss_mask": loss_mask,
           "position_ids": (np.broadcast_to(np.arange(L, dtype=dtype), labels.shape).copy()
                            if pos is None else pos.astype(dtype))}
    out.update((k, v) for k, v in batch.items() if k not in ("tokens", *FULL_KEYS))
    return out
