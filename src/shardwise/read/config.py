"""A read config: one JSON file that says what a training run reads, and how it is placed.

Why: "what did the model see at step N" (``shardwise trace``), a skip list and a blend
schedule all need the run's read described outside the training script, in a form a tool
can rebuild the readers from. A read config is the tree of the run's nodes — the data
(``cache``, or a ``blend`` of caches: :class:`~shardwise.read.compose.schedule.BlendNode`),
the reader with its order (``reader``: the reader's frozen config,
:mod:`shardwise.read.reader_config`, whose ``shuffle`` names the order and holds that
order's own options) and the placement (``placement``:
:class:`~shardwise.read.placement.Placement`) — and its JSON is that tree (names others
rely on)::

    {"cache": "cache/",                     # or a blend of caches:
     "blend": {"sources": {"web": "web/", "code": "code/"},
               "weights": {"web": 0.7, "code": 0.3}},   # or "schedule": [[step, {...}], ...]
                                             # (optional "length": the blend's nominal len)
     "reader": {"kind": "tokens",           # tokens (global placement) | stream | sft
                "seq_len": 2048, "seed": 0, "shuffle": "block", "block_size": 16},
                                             # ...any other argument of that reader
     "placement": {"global_batch_size": 16, "micro_batch_size": 2, "world_size": 4,
                   "sampler": "single",     # single | cyclic (+ "seed", "data_sharding")
                   "skip": [[100, 120]]},   # global steps [start, stop) left out
     "tokenizer": "tokenizer.json"}         # optional: decode (trace --text)

The flat form of earlier versions still reads (``"reader": "tokens"``, the reader's
arguments, ``global_batch_size``, ``micro_batch_size``, ``world_size`` and ``skip`` at the
top); :meth:`ReadConfig.to_dict` writes the tree.

Steps are global batches of ``global_batch_size`` examples; ``skip`` and a ``schedule``'s
steps become example positions (× ``global_batch_size``) for the sampler (a StreamDataset's
own ``skip=`` under stream placement; ``sft`` takes no skip list) and the blend.
:meth:`ReadConfig.from_state` rebuilds a config from a loader's saved state: the reader's
config, the placement's sampler and the skip list; never paths or the batch layout (give
those), nor a blend's sources' options (its state holds their fingerprints).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from shardwise.checkpoint import RETIRED, SKIP_KEY, LoaderState
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.read.compose.schedule import BlendNode
from shardwise.read.loader import LOADER_KIND, sampler_state_config
from shardwise.read.placement import Placement, order_part
from shardwise.read.reader_config import ReaderConfig
from shardwise.read.sampler import BatchSampler, SamplerKind, refuse_skip, skip_from_steps
from shardwise.world import World

_LAYOUT = ("global_batch_size", "micro_batch_size", "world_size")
_FLAT_TOP = {"cache", "blend", "reader", "skip", "tokenizer", *_LAYOUT}

class ReaderKind(Choice):
    """Which reader a config builds: ``tokens`` (TokenDataset, global placement through
    the BatchSampler), ``stream`` (StreamDataset, stream placement) or ``sft``
    (PackedSFT over the cache's documents)."""

    __option__ = "reader"

    TOKENS = "tokens"
    STREAM = "stream"
    SFT = "sft"


@dataclass(frozen=True)
class ReadConfig:
    """A parsed read config (see the module docs): the reader's kind and ``config`` (its
    frozen config, the order inside), the ``placement`` (``world_size`` set), the data
    (``cache`` or the ``blend`` node), and ``runtime``: the reader's other keyword
    arguments (where and how fast it reads: ``verify``, ``prefetch_chunks``, ...), passed
    as they are."""

    reader: ReaderKind
    config: ReaderConfig
    placement: Placement
    cache: str | None = None
    blend: BlendNode | None = None
    tokenizer: str | None = None
    runtime: dict[str, Any] = field(default_factory=dict)
    where: str = "read config"

    def __post_init__(self) -> None:
        if (self.cache is None) == (self.blend is None):
            raise ConfigError(f"{self.where}: give exactly one of 'cache' (a path) and "
                              "'blend' ({\"sources\": {...}, \"weights\": {...}})")
        if self.placement.world_size is None:
            raise ConfigError(f"{self.where}: the placement needs world_size (a read config "
                              "describes every rank)")
        if self.blend is not None:
            if not isinstance(self.blend, BlendNode):
                raise ConfigError(f"{self.where}: blend must be a BlendNode "
                                  f"(BlendNode.from_dict({{...}}, where)), got {self.blend!r}")
            if self.reader is not ReaderKind.TOKENS:
                raise ConfigError(f"{self.where}: a blend reads map-style 'tokens' readers "
                                  f"through the loader, not reader={self.reader.value!r}")
        p = self.placement
        if self.reader is not ReaderKind.TOKENS and (
                p.kind is not SamplerKind.SINGLE or p.seed or not p.data_sharding
                or p.epochs is not None or p.total_samples is not None):
            raise ConfigError(f"{self.where}: reader {self.reader.value!r} places its own "
                              "examples (rank r's j-th is global j·R + r): its placement "
                              "takes the batch layout and skip, not a sampler or a run length "
                              "(those are the reader's own arguments)")
        if self.skip and self.reader is ReaderKind.SFT:
            refuse_skip(self.skip, f"{self.where}: reader {self.reader.value!r}")

    # -- the nodes' fields, by the names of the flat form -------------------------------------
    @property
    def seq_len(self) -> int:
        return int(self.config.seq_len)  # type: ignore[attr-defined]

    @property
    def seed(self) -> int:
        return int(self.config.seed or 0)  # type: ignore[attr-defined]

    @property
    def global_batch_size(self) -> int:
        return self.placement.global_batch_size

    @property
    def micro_batch_size(self) -> int:
        return self.placement.micro_batch_size

    @property
    def world_size(self) -> int:
        return int(self.placement.world_size or 1)

    @property
    def skip(self) -> tuple[tuple[int, int], ...]:
        """Global-step ranges left out (the placement's ``skip_steps``)."""
        return self.placement.skip_steps

    @property
    def options(self) -> dict[str, Any]:
        """The reader's arguments but ``seq_len`` and ``seed``, by name (plain JSON)."""
        out = {k: v for k, v in self.config.options().items() if k not in ("seq_len", "seed")}
        return {**out, **self.runtime}

    # -- derived ------------------------------------------------------------------------
    @property
    def accumulation(self) -> int:
        """Micro-batches per rank per global step: ``B / (m × W)``."""
        return self.global_batch_size // (self.micro_batch_size * self.world_size)

    def skip_examples(self) -> tuple[tuple[int, int], ...]:
        """``skip`` as half-open example ranges of the global order (steps × B)."""
        return skip_from_steps(self.skip, self.global_batch_size)

    def sources(self) -> dict[str, str]:
        """Cache path per source name (``{"": path}`` for a single cache)."""
        if self.blend is None:
            return {"": str(self.cache)}
        return self.blend.paths()

    # -- building the readers -------------------------------------------------------------
    def build(self, rank: int = 0, *, caches: Mapping[str, Any] | None = None
              ) -> tuple[Any, BatchSampler | None]:
        """The dataset rank ``rank`` reads and its BatchSampler (global placement; ``None``
        for stream and sft, whose readers place examples themselves: rank ``r``'s ``j``-th
        is global ``j·R + r``). ``caches``: caches
        already open, by their path in this config (opening a large cache reads its
        whole ledger)."""
        world = World(rank, self.world_size)
        opened = dict(caches or {})
        reader = reader_class(self.reader)
        if self.reader is ReaderKind.STREAM:
            return self._call(reader, opened.get(self._path(), self._path()), world=world,
                              batch_size=self.micro_batch_size,
                              skip=self.skip_examples()), None
        if self.reader is ReaderKind.SFT:
            from shardwise.read.compose.records import CacheRecords

            records = CacheRecords(opened.get(self._path(), self._path()))
            return self._call(reader, records, world=world), None
        ds = (self._blend(opened) if self.blend is not None
              else self._call(reader, opened.get(self._path(), self._path())))
        return ds, self.sampler(len(ds), world)

    def sampler(self, n: int, world: World) -> BatchSampler:
        """The BatchSampler of ``world``'s rank over ``n`` examples per epoch."""
        return self.placement.batch_sampler(n, world)

    def _path(self) -> str:
        return str(self.cache)

    def _blend(self, opened: dict[str, Any]) -> Any:
        from shardwise.read.compose.blend import Blend

        assert self.blend is not None  # for mypy: _blend is called only for a blend
        reader = reader_class(ReaderKind.TOKENS)
        parts = [self._call(reader, opened.get(p, p)) for p in self.blend.paths().values()]
        try:
            return Blend(parts, seed=self.seed, names=self.blend.names,
                         schedule=self.blend.stages(self.global_batch_size),
                         length=self.blend.length)
        except ConfigError as e:
            raise ConfigError(f"{self.where}: {e}") from None

    def _call(self, cls: Any, *args: Any, **kwargs: Any) -> Any:
        """``cls(*args, config, **runtime, **kwargs)``: the reader from its config node
        (an unknown runtime argument is a ConfigError naming its fields)."""
        try:
            return cls(*args, self.config, **self.runtime, **kwargs)
        except ConfigError as e:
            raise ConfigError(f"{self.where}: {e}") from None

    # -- from a file or a state -----------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "read config",
                  base: Path | None = None) -> ReadConfig:
        """From the JSON object (the tree, or the flat form of earlier versions); relative
        cache paths resolve against ``base``."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: a read config is a JSON object, got "
                              f"{type(d).__name__}")
        tree = _as_tree(d, where)
        node = dict(tree["reader"])
        try:
            kind = ReaderKind.parse(node.pop("kind", "tokens"))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if "seq_len" not in node:
            raise ConfigError(f"{where}: missing ['seq_len']; a read config needs seq_len, "
                              "global_batch_size, micro_batch_size and world_size")
        node.setdefault("seed", 0)
        config_class = reader_class(kind).config_class
        names = config_class.argument_names()
        try:
            config = config_class.of(None, {k: v for k, v in node.items() if k in names})
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
        cache = _resolve(tree.get("cache"), base)
        blend = BlendNode.from_dict(tree["blend"], where) if tree.get("blend") else None
        if blend is not None and base is not None:
            blend = replace(blend, sources=tuple((n, _resolve(p, base))
                                                 for n, p in blend.sources))
        unknown = sorted(set(tree) - {"cache", "blend", "reader", "placement", "tokenizer"})
        if unknown:
            raise ConfigError(f"{where}: a read config has no {unknown} (its nodes are "
                              "cache or blend, reader, placement, tokenizer)")
        return cls(kind, config, Placement.from_dict(tree["placement"], where), cache=cache,
                   blend=blend,
                   tokenizer=_resolve(tree.get("tokenizer"), base),
                   runtime={k: v for k, v in node.items() if k not in names}, where=where)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the tree (the inverse of :meth:`from_dict`)."""
        out: dict[str, Any] = {"reader": {"kind": self.reader.value, **self.config.options(),
                                          **self.runtime},
                               "placement": self.placement.to_dict()}
        out.update({"cache": self.cache} if self.blend is None
                   else {"blend": self.blend.to_dict()})
        if self.tokenizer is not None:
            out["tokenizer"] = self.tokenizer
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **given: Any) -> ReadConfig:
        """The config of the run that saved ``state`` (a loader's, a StreamDataset's or a
        PackedSFT's ``state_dict()``). A state holds the reader's config (read back by
        its ``config_class``) and its sampler, but no paths and no batch layout: ``given``
        supplies those (``cache``, or ``blend={"sources": {name: path}}``, whose mix the
        state holds; ``global_batch_size``, ``micro_batch_size``, ``world_size``) and may
        override any field, by its flat name. :func:`check_state` then proves the rebuilt
        reader is the saved one."""
        st = LoaderState.from_dict(dict(state) if isinstance(state, Mapping) else state)
        cfg, kind = dict(st.config), _kind_of_state(st.kind)
        reader: dict[str, Any] = {"kind": kind.value}
        top: dict[str, Any] = {}
        if "blend" in cfg:  # a Blend's state (its sources' configs are theirs to give)
            reader["seed"], top["blend"] = BlendNode.from_state(cfg, given)
        else:
            reader.update(reader_class(kind).config_class.from_state(cfg))
        placement = Placement.from_state(cfg, **given)
        top.update({k: given.pop(k) for k in ("cache", "blend", "tokenizer") if k in given})
        placement.update({k: given.pop(k) for k in (*_LAYOUT, "skip") if k in given})
        reader.update(given)  # what is left names the reader's arguments
        blend = top.get("blend")
        missing = [k for k in _LAYOUT if k not in placement] + (
            ["cache"] if blend is None and "cache" not in top else
            ["blend.sources"] if isinstance(blend, Mapping) and "sources" not in blend else [])
        if missing:
            raise ConfigError(f"a {st.kind!r} state holds the order, not {missing}: give "
                              f"them (trace --cache PATH, or --blend NAME=PATH ...; "
                              "--global-batch-size B --micro-batch-size M --world-size W)")
        return cls.from_dict({**top, "reader": reader, "placement": placement},
                             where=f"the config of a {st.kind!r} state")


def reader_class(kind: ReaderKind) -> Any:
    """The reader a config of ``kind`` builds; its ``config_class`` is the frozen config it
    is built from (:mod:`shardwise.read.reader_config`)."""
    if kind is ReaderKind.STREAM:
        from shardwise.read.stream.dataset import StreamDataset

        return StreamDataset
    if kind is ReaderKind.SFT:
        from shardwise.read.compose.sft_pack import PackedSFT

        return PackedSFT
    from shardwise.read.tokens.dataset import TokenDataset

    return TokenDataset


def check_state(dataset: Any, state: Mapping[str, Any],
                sampler: BatchSampler | None = None) -> None:
    """Refuse a state the reader ``dataset`` (built from :meth:`ReadConfig.from_state`)
    and its ``sampler`` did not save: the order's fields and the placement's must be the
    state's, named when they differ (a wrong ``--cache``, ``seq_len``, seed or sampler
    would trace another run's data). Without a sampler (a reader that places itself, or
    the order alone) the placement's part is not compared; the skip list never is (a
    config's own skip list is what it traces)."""
    saved = dict(state.get("config", {}))
    mine = (sampler_state_config(dataset, sampler) if sampler is not None
            else dict(dataset.state_config()))
    if sampler is None:
        saved, mine = order_part(saved), order_part(mine)
    diffs = [f"{k}: state has {saved.get(k)!r}, this config has {mine.get(k)!r}"
             for k in sorted(set(saved) | set(mine) - {SKIP_KEY})
             if saved.get(k) != mine.get(k)
             and not (k in RETIRED and k not in mine)]  # keys a state held before: no-ops
    if diffs:
        raise ConfigError("the state was saved by another read than this config "
                          "describes (" + "; ".join(diffs) + "); give the cache and "
                          "options the run used")


def load_read_config(path: str | os.PathLike[str]) -> ReadConfig:
    """Read a config file; paths in it are relative to the file's directory."""
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e}); a read config is one JSON object "
                          "(see shardwise.read.config)") from None
    return ReadConfig.from_dict(data, where=str(p), base=p.parent)


def _kind_of_state(kind: str) -> ReaderKind:
    """The reader a state of ``kind`` was saved by; ConfigError for a kind a read config
    cannot rebuild (records, a blend of streams, a custom reader)."""
    if kind == LOADER_KIND:
        return ReaderKind.TOKENS
    for k in (ReaderKind.STREAM, ReaderKind.SFT):
        if reader_class(k).state_kind == kind:
            return k
    raise ConfigError(f"a read config rebuilds a shardwise loader's state (a TokenDataset or "
                      f"Blend through the loader), a StreamDataset's or a PackedSFT's; this "
                      f"state's kind is {kind!r}")


def _as_tree(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A read config's JSON as the tree (the flat form's keys moved into their nodes)."""
    if isinstance(d.get("reader"), Mapping) or "placement" in d:
        missing = [k for k in ("reader", "placement") if not isinstance(d.get(k), Mapping)]
        if missing:
            raise ConfigError(f"{where}: a read config's nodes {missing} are JSON objects")
        return dict(d)
    missing = [k for k in ("seq_len", *_LAYOUT) if k not in d]
    if missing:
        raise ConfigError(f"{where}: missing {missing}; a read config needs seq_len, "
                          "global_batch_size, micro_batch_size and world_size")
    tree = {k: d[k] for k in ("cache", "blend", "tokenizer") if k in d}
    tree["reader"] = {"kind": d.get("reader", "tokens"),
                      **{k: v for k, v in d.items() if k not in _FLAT_TOP}}
    tree["placement"] = {k: d[k] for k in (*_LAYOUT, "skip") if k in d}
    return tree


def _resolve(value: Any, base: Path | None) -> Any:
    if base is None or not isinstance(value, str) or "://" in value or os.path.isabs(value):
        return value
    return str(base / value)
