"""Packed SFT examples: records with ``input_ids`` / ``labels`` packed into ``seq_len`` rows.

:class:`PackedSFT` reads a map-style source of processed records (a list of dicts, or any
dataset with ``len()`` and ``[i]`` — e.g. the output of
:class:`~shardwise.writer.chat.ChatProcessor`) group by group (``group_size``
consecutive records), packs each group with
:func:`~shardwise.plan.sft_packing.pack_group` and yields one row per bin::

    input_ids     [seq_len] int64   records back to back, then ``pad_id``
    labels        [seq_len] int64   next-token targets (read/examples.py): labels[t] is the
                                    record's label of token t + 1; -100 on padding and on
                                    each record's last token (see below)
    loss_mask     [seq_len] float32 1.0 where labels != -100
    position_ids  [seq_len] int64   restart at 0 at each record (and at the padding)
    cu_seqlens    [k + 1]   int32   record boundaries, then ``seq_len`` (the padding is one
                                    more segment, so rows stack like TokenDataset's)

A *record's* labels are per token (Hugging Face's convention: ``labels[t]`` is token
``t``'s own label, -100 for no loss); a *row's* are next-token targets, like every
shardwise example (:mod:`shardwise.read.examples`): ``row["labels"][t]`` is the label of
the token after ``t`` in the same record. A record's last token never predicts the next
record's first, so its target is -100 — as ``DataCollatorWithFlattening`` does. A record
without ``labels`` trains on every token (or on ``loss_mask`` when it has one).

With ``seed``, records are read in a keyed random order per epoch and each group's bins
are shuffled; without it, in source order with bins in first-fit-decreasing order.

State keys (a :class:`~shardwise.checkpoint.LoaderState`, kind ``sft_pack``): ``consumed``
(rows yielded) and ``extra = {"epoch", "window", "bin"}`` — the next row is bin ``bin``
of packing group ``window`` of epoch ``epoch`` (the key keeps the groups' first name,
packing windows, so saved states load; ``window=`` is the deprecated name of
``group_size=``). Resuming re-plans that one group: O(group_size), never a replay of
consumed data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import LoaderState, Resumable, as_count, fingerprint
from shardwise.errors import ConfigError, InputError, StateError
from shardwise.plan.permutation import PERMUTATION_VERSION, Permutation, derive_seed
from shardwise.plan.sft_packing import (
    SFT_PACKING_VERSION,
    Overlong,
    PackPlan,
    group_range,
    num_pack_groups,
    pack_group,
)
from shardwise.read.deprecated import renamed
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.examples import IGNORE_INDEX, NEXT_TOKEN
from shardwise.read.guard import GuardedReader

Example = dict[str, npt.NDArray[Any]]


def source_identity(source: Any) -> str:
    """What a checkpoint records about a source: its fingerprint when it has one."""
    fp = getattr(source, "fingerprint", None)
    if isinstance(fp, str):
        return fp
    if hasattr(source, "state_config"):
        return fingerprint(source.state_config())
    state = source.state_dict() if hasattr(source, "state_dict") else None
    if isinstance(state, dict) and isinstance(state.get("fingerprint"), str):
        return str(state["fingerprint"])  # a shardwise stream's state names its config
    size = f"(len={len(source)})" if hasattr(source, "__len__") else ""
    return f"{type(source).__qualname__}{size}"


def _labels(rec: dict[str, Any], ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    if rec.get("labels") is not None:
        return np.asarray(rec["labels"], dtype=np.int64)
    if rec.get("loss_mask") is not None:
        return np.where(np.asarray(rec["loss_mask"]) > 0, ids, IGNORE_INDEX)
    return ids


class PackedSFT(GuardedReader, Resumable):
    """Rows of packed SFT records; an iterable with exact, O(group_size) resume.

    >>> rows = PackedSFT(records, seq_len=2048, group_size=1024, seed=1)  # doctest: +SKIP
    >>> row = next(iter(rows)); rows.state_dict()["extra"]            # doctest: +SKIP
    {'epoch': 0, 'window': 0, 'bin': 1}
    """

    state_kind = "sft_pack"
    label_convention = NEXT_TOKEN  # labels are next-token targets: read/examples.py

    def __init__(self, records: Sequence[dict[str, Any]], *, seq_len: int,
                 group_size: int = 1024, seed: int | None = None, epochs: int | None = 1,
                 overlong: str | Overlong = Overlong.ERROR, pad_id: int = 0,
                 window: int | None = None) -> None:
        group_size = renamed("window", window, "group_size", group_size, "PackedSFT",
                             default=1024)
        seq_len = as_count(seq_len, "seq_len", minimum=1, error=ConfigError)
        group_size = as_count(group_size, "group_size", minimum=1, error=ConfigError)
        epochs = None if epochs is None else as_count(epochs, "epochs", minimum=1,
                                                      error=ConfigError)
        seed = None if seed is None else as_count(seed, "seed", error=ConfigError)
        try:
            self.overlong = Overlong.parse(overlong)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if len(records) == 0:
            raise ConfigError("PackedSFT needs at least one record")
        self.records = records
        self.seq_len, self.group_size, self.seed, self.epochs = seq_len, group_size, seed, epochs
        self.pad_id = pad_id
        self.num_groups = num_pack_groups(len(records), group_size)
        self._epoch = self._group = self._bin = self._consumed = 0
        self._cached: tuple[tuple[int, int], PackPlan, list[dict[str, Any]]] | None = None
        self.stats = {"groups": 0, "dropped": 0, "truncated": 0, "truncated_tokens": 0}

    def __repr__(self) -> str:
        return (f"PackedSFT({len(self.records):,} records, seq_len={self.seq_len}, "
                f"group_size={self.group_size}, seed={self.seed}, epochs={self.epochs}, "
                f"overlong={self.overlong.value!r}, {describe_drops(self.drops())})")

    def drops(self) -> list[Drop]:
        """Records left out and tokens cut in the groups packed so far (``stats``):
        empty records, and records over ``seq_len`` under ``overlong='drop'`` or
        ``'truncate'``."""
        st, so_far = self.stats, f"so far ({self.stats['groups']:,} groups packed)"
        out = []
        if st["dropped"]:
            out.append(Drop(st["dropped"], "records", "empty, or longer than seq_len with "
                            f"overlong='drop', {so_far}"))
        if st["truncated_tokens"]:
            out.append(Drop(st["truncated_tokens"], "tokens", f"cut from {st['truncated']:,} "
                            f"records longer than seq_len (overlong='truncate'), {so_far}"))
        return out

    # -- identity ---------------------------------------------------------------------------
    def state_config(self) -> dict[str, Any]:
        # "window": group_size's first name, kept so fingerprints (and states) match
        return {"seq_len": self.seq_len, "window": self.group_size, "seed": self.seed,
                "epochs": self.epochs, "overlong": self.overlong.value, "pad_id": self.pad_id,
                "records": len(self.records), "source": source_identity(self.records),
                "sft_packing_version": SFT_PACKING_VERSION,
                "permutation_version": PERMUTATION_VERSION}

    # -- plan -------------------------------------------------------------------------------
    def _positions(self, epoch: int, g: int) -> npt.NDArray[np.int64]:
        """Source indices of the records of group ``g`` of ``epoch``."""
        start, stop = group_range(g, self.group_size, len(self.records))
        pos = np.arange(start, stop, dtype=np.int64)
        if self.seed is None:
            return pos
        return Permutation(len(self.records), derive_seed(self.seed, "sft_pack.records"),
                           epoch)(pos)

    def plan(self, epoch: int, g: int) -> tuple[PackPlan, list[dict[str, Any]]]:
        """The packing plan of group ``g`` of ``epoch`` and that group's records."""
        if self._cached is not None and self._cached[0] == (epoch, g):
            return self._cached[1], self._cached[2]
        positions = self._positions(epoch, g)
        recs = [self.records[int(i)] for i in positions]
        lengths = np.fromiter((self._length(r, int(i)) for r, i in zip(recs, positions,
                                                                         strict=True)),
                              dtype=np.int64, count=len(recs))
        if self.overlong is Overlong.ERROR and (lengths > self.seq_len).any():
            k = int(np.flatnonzero(lengths > self.seq_len)[0])
            raise InputError(f"record {int(positions[k])} has {int(lengths[k])} tokens, more "
                             f"than seq_len={self.seq_len}; cap it when processing "
                             "(max_length=...) or pass overlong='truncate' or 'drop'",
                             reason="too_long")
        seed = None if self.seed is None else derive_seed(self.seed, "sft_pack.bins", epoch)
        plan = pack_group(lengths, self.seq_len, seed=seed, group_index=g,
                          overlong=self.overlong)
        self._cached = ((epoch, g), plan, recs)
        self.stats["groups"] += 1
        self.stats["dropped"] += len(plan.dropped)
        self.stats["truncated"] += len(plan.truncated)
        self.stats["truncated_tokens"] += int((lengths[plan.truncated] - self.seq_len).sum())
        return plan, recs

    @staticmethod
    def _length(rec: Any, index: int) -> int:
        if not isinstance(rec, dict) or rec.get("input_ids") is None:
            raise InputError(f"record {index} has no 'input_ids' (a dict with input_ids and "
                             "optionally labels / loss_mask is expected)",
                             reason="missing_field")
        return len(rec["input_ids"])

    # -- rows ---------------------------------------------------------------------------------
    def row(self, plan: PackPlan, recs: list[dict[str, Any]], b: int) -> Example:
        """Assemble bin ``b`` of a plan into one padded row."""
        L = self.seq_len
        ids = np.full(L, self.pad_id, dtype=np.int64)
        labels = np.full(L, IGNORE_INDEX, dtype=np.int64)
        at = 0
        for r, n in zip(plan.bin(b).tolist(), plan.bin_lengths(b).tolist(), strict=True):
            rec_ids = np.asarray(recs[r]["input_ids"], dtype=np.int64)[:n]
            ids[at: at + n] = rec_ids
            # a record's labels are per token (HF); a row's are next-token targets, and a
            # record's last token has no target inside the record
            labels[at: at + n - 1] = _labels(recs[r], rec_ids)[1:n]
            at += n
        cu = plan.cu_seqlens(b)
        positions = np.zeros(L, dtype=np.int64)
        positions[:at] = plan.position_ids(b)
        if at < L:
            cu = np.append(cu, np.int32(L))
            positions[at:] = np.arange(L - at)
        return {"input_ids": ids, "labels": labels,
                "loss_mask": (labels != IGNORE_INDEX).astype(np.float32),
                "position_ids": positions, "cu_seqlens": cu}

    def __iter__(self) -> Iterator[Example]:
        """Continue from the current position (a fresh object starts at row 0)."""
        empty_groups = 0
        while self.epochs is None or self._epoch < self.epochs:
            plan, recs = self.plan(self._epoch, self._group)
            if self._bin < plan.num_bins:
                example = self.row(plan, recs, self._bin)
                self._bin += 1
                self._consumed += 1
                empty_groups = 0
                yield example
                continue
            empty_groups += 1
            if empty_groups > self.num_groups:
                raise ConfigError("every record was dropped: there is nothing to pack")
            self._group, self._bin = self._group + 1, 0
            if self._group == self.num_groups:
                self._epoch, self._group = self._epoch + 1, 0

    # -- state --------------------------------------------------------------------------------
    def _position(self) -> tuple[int, dict[str, Any]]:
        return self._consumed, {"epoch": self._epoch, "window": self._group, "bin": self._bin}

    def _seek(self, st: LoaderState) -> None:
        """Continue at the saved (epoch, group, bin)."""
        epoch, g, b = st.extra_counts("epoch", "window", "bin")
        if g >= self.num_groups:
            raise StateError(f"state position epoch={epoch} window={g} bin={b} is outside "
                             f"this reader's {self.num_groups} packing groups")
        self._check_in_run(epoch, g, b)
        self._epoch, self._group, self._bin, self._consumed = epoch, g, b, st.consumed

    def _check_in_run(self, epoch: int, g: int, b: int) -> None:
        """StateError for a position past the end of a finite run (the end itself, epoch
        ``epochs`` group 0 bin 0, is where a finished pass stops) or past a group's
        bins (which re-plans that one group, as resuming does)."""
        where = f"state position epoch={epoch} window={g} bin={b}"
        if self.epochs is not None and (epoch, g, b) > (self.epochs, 0, 0):
            raise StateError(f"{where} is past the end of this run ({self.epochs} epochs of "
                             f"{self.num_groups} packing groups); resume with the epochs= it was "
                             "saved with")
        if epoch < (self.epochs or epoch + 1):
            bins = self.plan(epoch, g)[0].num_bins
            if b > bins:
                raise StateError(f"{where} is past the end of that packing group ({bins} rows); "
                                 "the state was edited or saved from other records")


__all__ = ["IGNORE_INDEX", "PackedSFT", "source_identity"]
