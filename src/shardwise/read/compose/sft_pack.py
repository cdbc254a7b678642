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

**Placement** (``world=``, default :meth:`World.detect`): the rows form one global order,
whatever the number of ranks; rank ``r`` of ``R`` serves the rows ``p`` with ``p % R == r``
(:meth:`World.owns`: its ``j``-th row is global row ``j·R + r``, the stream rule with one
stream, which ``shardwise trace`` applies). Every rank plans every packing group (record
lengths only) and reads the tokens of its own rows only. A finite run (``epochs=E``) gives
every rank the same number of rows: a rank whose share ends first serves masked *padding
rows* (``pad_id``, labels -100, ``loss_mask`` 0; counted in ``pads_served``) until the
others finish, so data-parallel steps stay aligned and no row is repeated::

    37 rows, R = 2:  rank 0 rows 0 2 … 36,  rank 1 rows 1 3 … 35 + one padding row

State keys (a :class:`~shardwise.checkpoint.LoaderState`, kind ``sft_pack``): ``consumed``
(rows of the global order received by all ranks together — ``start + received × R``, the
same on every rank) and ``extra = {"epoch", "window", "bin"}`` — row ``consumed`` is bin
``bin`` of packing group ``window`` of epoch ``epoch`` (the key keeps the groups' first
name, packing windows, so saved states load; ``window=`` is the deprecated name of
``group_size=``). Resuming under any ``R``, rank ``r`` continues at its first row ``>=
consumed``; it re-plans that one group: O(group_size), never a replay of consumed data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import LoaderState, Resumable, as_count
from shardwise.errors import ConfigError, InputError, StateError
from shardwise.format.chunk import IGNORE_INDEX
from shardwise.plan.permutation import PERMUTATION_VERSION, Permutation, derive_seed
from shardwise.plan.sft_packing import (
    SFT_PACKING_VERSION,
    Overlong,
    PackPlan,
    group_range,
    num_pack_groups,
    pack_group,
)
from shardwise.read.compose.sft_rows import SftRows, sft_runs
from shardwise.read.deprecated import renamed
from shardwise.read.drops import Drop, describe_drops
from shardwise.read.examples import NEXT_TOKEN, Output
from shardwise.read.guard import (
    GuardedReader,
    refuse_framework_sharding,
    register_with_torch,
    torch_worker,
)
from shardwise.read.orders.base import Runs
from shardwise.read.reader_config import ReaderConfig, source_identity, state_key
from shardwise.world import World

Example = dict[str, npt.NDArray[Any]]
Position = tuple[int, int, int]  # (epoch, packing group, bin) of a row
PLANS_KEPT, BINS_KEPT = 3, 4096


@dataclass(frozen=True)
class SftConfig(ReaderConfig):
    """What defines a PackedSFT's rows (all of it is fingerprinted): its keyword arguments,
    its state's fields, what a read config rebuilds it from
    (:mod:`shardwise.read.reader_config`). ``group_size`` is stored as ``window``, its
    first name, so saved states keep their fingerprints."""

    reader = "PackedSFT"

    seq_len: int
    group_size: int = field(default=1024, metadata=state_key("window"))
    seed: int | None = None
    epochs: int | None = 1
    overlong: Overlong | str = Overlong.ERROR
    pad_id: int = 0

    def __post_init__(self) -> None:
        for name, low in (("seq_len", 1), ("group_size", 1)):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=low,
                                                    error=ConfigError))
        for name, low in (("epochs", 1), ("seed", 0)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_count(getattr(self, name), name,
                                                        minimum=low, error=ConfigError))
        try:
            object.__setattr__(self, "overlong", Overlong.parse(self.overlong))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _labels(rec: dict[str, Any], ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    if rec.get("labels") is not None:
        return np.asarray(rec["labels"], dtype=np.int64)
    if rec.get("loss_mask") is not None:
        return np.where(np.asarray(rec["loss_mask"]) > 0, ids, IGNORE_INDEX)
    return ids


class PackedSFT(GuardedReader, Resumable):
    """Rows of packed SFT records; an iterable with exact, O(group_size) resume.

    Its rows are a :class:`SftConfig`: pass its fields as keyword arguments (``seq_len``,
    ``group_size``, ``seed``, ``epochs``, ``overlong``, ``pad_id``) or ``config=`` one.

    >>> rows = PackedSFT(records, seq_len=2048, group_size=1024, seed=1)  # doctest: +SKIP
    >>> row = next(iter(rows)); rows.state_dict()["extra"]            # doctest: +SKIP
    {'epoch': 0, 'window': 0, 'bin': 1}
    """

    state_kind = "sft_pack"
    label_convention = NEXT_TOKEN  # labels are next-token targets: read/examples.py
    config_class = SftConfig  # what it is built from: its arguments, state and fingerprint

    def __init__(self, records: Sequence[dict[str, Any]], config: SftConfig | None = None,
                 *, window: int | None = None, world: World | None = None,
                 output: Output | None = None, **options: Any) -> None:
        if window is not None:  # the deprecated name of group_size
            options["group_size"] = renamed("window", window, "group_size",
                                            options.get("group_size", 1024), "PackedSFT",
                                            default=1024)
        self.config, self.output = self.config_class.of(config, options), Output.of(output)
        if len(records) == 0:
            raise ConfigError("PackedSFT needs at least one record")
        self.world = World.resolve(world, reader="PackedSFT")
        register_with_torch(PackedSFT)  # an IterableDataset, if torch is imported
        self.records = records
        self.num_groups = num_pack_groups(len(records), self.group_size)
        self._epoch = self._group = self._bin = self._consumed = 0
        self.pads_served = 0  # padding rows yielded (a finite run's aligned end)
        # the last plans made (a rank's next row and the state's position may lie in
        # neighbouring groups), and the rows of the groups crossed lately: with many ranks
        # one step of R rows spans several groups, which are counted, not re-planned
        self._plans: dict[tuple[int, int], tuple[PackPlan, list[dict[str, Any]]]] = {}
        self._bins: dict[tuple[int, int], int] = {}
        self._counted = (-1, -1)  # the furthest group whose drops are in ``stats``
        self.stats = {"groups": 0, "dropped": 0, "truncated": 0, "truncated_tokens": 0}
        self._rows: SftRows | None = None  # rows per packing group, counted for locate

    def __repr__(self) -> str:
        return (f"PackedSFT({len(self.records):,} records, seq_len={self.seq_len}, "
                f"group_size={self.group_size}, seed={self.seed}, epochs={self.epochs}, "
                f"overlong={self.overlong.value!r}, {self.world}, "
                f"{describe_drops(self.drops())})")

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
        return {**self.config.state(), "records": len(self.records),
                "source": source_identity(self.records),
                "sft_packing_version": SFT_PACKING_VERSION,
                "permutation_version": PERMUTATION_VERSION}

    # the config's fields, read where the packing needs them
    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def group_size(self) -> int:
        return self.config.group_size

    @property
    def seed(self) -> int | None:
        return self.config.seed

    @property
    def epochs(self) -> int | None:
        return self.config.epochs

    @property
    def overlong(self) -> Overlong:
        return Overlong(self.config.overlong)

    @property
    def pad_id(self) -> int:
        return self.config.pad_id

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
        hit = self._plans.get((epoch, g))
        if hit is not None:
            return hit
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
        self._plans[(epoch, g)] = (plan, recs)
        _keep(self._plans, PLANS_KEPT)
        self._bins[(epoch, g)] = plan.num_bins
        _keep(self._bins, BINS_KEPT)
        if (epoch, g) > self._counted:  # each group once, in the order they are read
            self._counted = (epoch, g)
            self.stats["groups"] += 1
            self.stats["dropped"] += len(plan.dropped)
            self.stats["truncated"] += len(plan.truncated)
            self.stats["truncated_tokens"] += int((lengths[plan.truncated]
                                                   - self.seq_len).sum())
        return plan, recs

    def num_bins(self, epoch: int, g: int) -> int:
        """The rows of group ``g`` of ``epoch`` (planned once while it is remembered)."""
        n = self._bins.get((epoch, g))
        return self.plan(epoch, g)[0].num_bins if n is None else n

    def locate(self, indices: npt.ArrayLike) -> Runs:
        """The runs of stored tokens behind global rows ``indices`` (records of a token
        cache: :class:`~shardwise.read.compose.records.CacheRecords`), one run a record,
        as every order answers (:mod:`shardwise.read.compose.sft_rows`)."""
        if self._rows is None:
            self._rows = SftRows(self)
        return sft_runs(self, self._rows, indices)

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

    def pad_row(self) -> Example:
        """A masked padding row: ``pad_id`` tokens, no target, one segment."""
        L = self.seq_len
        return {"input_ids": np.full(L, self.pad_id, dtype=np.int64),
                "labels": np.full(L, IGNORE_INDEX, dtype=np.int64),
                "loss_mask": np.zeros(L, dtype=np.float32),
                "position_ids": np.arange(L, dtype=np.int64),
                "cu_seqlens": np.asarray([0, L], dtype=np.int32)}

    def advance(self, at: Position, k: int) -> Position | None:
        """The row ``k`` rows after the row at ``at`` (``k = 0``: ``at`` itself, or the
        first row after it when ``at`` is past its group's bins); ``None`` past the end of
        a finite run. Plans the groups it crosses (record lengths only)."""
        e, g, b = at
        empty = 0
        while self.epochs is None or e < self.epochs:
            bins = self.num_bins(e, g)
            if b + k < bins:
                return e, g, b + k
            k -= max(bins - b, 0)
            empty = 0 if bins else empty + 1
            if empty > self.num_groups:
                raise ConfigError("every record was dropped: there is nothing to pack")
            e, g, b = (e + 1, 0, 0) if g + 1 == self.num_groups else (e, g + 1, 0)
        return None

    def __iter__(self) -> Iterator[Example]:
        """Continue from the current position (a fresh object starts at row 0): this
        rank's rows of the global order (see the module docs)."""
        if torch_worker() is not None:
            raise ConfigError("PackedSFT cannot run in a DataLoader worker process: each "
                              "worker would serve this rank's rows again and state_dict() "
                              "could not see their position; use num_workers=0")
        refuse_framework_sharding("PackedSFT")
        size = self.world.size
        while True:
            mark = self.advance((self._epoch, self._group, self._bin), 0)
            if mark is None:  # every rank has served the run's last row
                self._epoch, self._group, self._bin = self.epochs or 0, 0, 0
                return
            c = self._consumed  # this rank's row: the first at or after c that it owns
            mine = self.advance(mark, next(p for p in range(c, c + size)
                                           if self.world.owns(p)) - c)
            example = self.pad_row() if mine is None else self.row(
                *self.plan(*mine[:2]), mine[2])
            self.pads_served += mine is None
            after = self.advance(mark, size)
            self._epoch, self._group, self._bin = after or (self.epochs or 0, 0, 0)
            self._consumed += size
            yield example if self.output.is_default else self._shaped(example)

    def _shaped(self, example: Example) -> Example:
        """A row in ``output``'s form: compact rows keep the same keys (so they collate);
        their labels must be the next tokens (a record may carry labels of its own)."""
        return self.output.shape(example, np.int32, keep=("loss_mask", "position_ids"),
                                 check=True)

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


def _keep(d: dict[Any, Any], n: int) -> None:
    """Forget the oldest entries of ``d`` beyond ``n``."""
    while len(d) > n:
        del d[next(iter(d))]


__all__ = ["PackedSFT"]
