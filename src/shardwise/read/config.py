"""A read config: one JSON file that says what a training run reads, and how it is placed.

Why: "what did the model see at step N" (``shardwise trace``), a skip list and a blend
schedule all need the run's read described outside the training script, in a form a tool
can rebuild the readers from. The schema (names others rely on)::

    {"cache": "cache/"                      # or a blend of caches:
     "blend": {"sources": {"web": "web/", "code": "code/"},
               "weights": {"web": 0.7, "code": 0.3}},   # or "schedule": [[step, {...}], ...]
                                             # (optional "length": the blend's nominal len)
     "reader": "tokens",                     # tokens (global placement) | stream | sft
     "seq_len": 2048, "seed": 0, "shuffle": "window",   # ...any other reader argument
     "global_batch_size": 16, "micro_batch_size": 2, "world_size": 4,
     "skip": [[100, 120]],                   # global steps [start, stop) left out
     "tokenizer": "tokenizer.json"}          # optional: decode (trace --text)

Steps are global batches of ``global_batch_size`` examples; ``skip`` and a ``schedule``'s
steps become example positions (× ``global_batch_size``) for the sampler (a StreamDataset's
own ``skip=`` under stream placement; ``sft`` takes no skip list) and the blend.
:meth:`ReadConfig.from_state` rebuilds a config from a loader's saved state: the reader's
config (:mod:`shardwise.read.reader_config`: the fields a reader is built from are the
fields its state holds) and the skip list; never paths or the batch layout (give those),
nor a blend's sources' options (its state holds their fingerprints).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from shardwise.checkpoint import RETIRED, SKIP_KEY, LoaderState, as_count
from shardwise.choice import Choice
from shardwise.errors import ConfigError
from shardwise.read.loader import PLACEMENT_KEYS
from shardwise.read.sampler import (
    BatchSampler,
    accumulation_steps,
    refuse_skip,
    skip_from_steps,
)
from shardwise.world import World

_LAYOUT = ("global_batch_size", "micro_batch_size", "world_size")
_TOP = {"cache", "blend", "reader", "seq_len", "seed", "skip", "tokenizer", *_LAYOUT}

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
    """A parsed read config (see the module docs); ``options`` are the reader's other
    keyword arguments, passed as they are."""

    reader: ReaderKind
    seq_len: int
    global_batch_size: int
    micro_batch_size: int
    world_size: int
    cache: str | None = None
    blend: dict[str, Any] | None = None
    seed: int = 0
    skip: tuple[tuple[int, int], ...] = ()
    tokenizer: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    where: str = "read config"

    def __post_init__(self) -> None:
        if (self.cache is None) == (self.blend is None):
            raise ConfigError(f"{self.where}: give exactly one of 'cache' (a path) and "
                              "'blend' ({\"sources\": {...}, \"weights\": {...}})")
        for name in ("seq_len", *_LAYOUT):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=1,
                                                    error=ConfigError))
        object.__setattr__(self, "seed", as_count(self.seed, "seed", error=ConfigError))
        accumulation_steps(self.global_batch_size, self.micro_batch_size, self.world_size)
        try:  # the sampler's own check of step ranges (pairs, 0 <= start < stop)
            skip_from_steps(self.skip, self.global_batch_size)
        except ConfigError as e:
            raise ConfigError(f"{self.where}: {e}") from None
        object.__setattr__(self, "skip", tuple(sorted((int(a), int(b)) for a, b in self.skip)))
        if self.blend is not None:
            _check_blend(self.blend, self.where)
            if self.reader is not ReaderKind.TOKENS:
                raise ConfigError(f"{self.where}: a blend reads map-style 'tokens' readers "
                                  f"through the loader, not reader={self.reader.value!r}")
        if self.skip and self.reader is ReaderKind.SFT:
            refuse_skip(self.skip, f"{self.where}: reader {self.reader.value!r}")

    # -- derived ------------------------------------------------------------------------
    @property
    def accumulation(self) -> int:
        """Micro-batches per rank per global step: ``B / (m × W)``."""
        return self.global_batch_size // (self.micro_batch_size * self.world_size)

    def skip_examples(self) -> tuple[tuple[int, int], ...]:
        """``skip`` as half-open example ranges of the global order (steps × B)."""
        return skip_from_steps(self.skip, self.global_batch_size)

    def schedule_examples(self) -> list[tuple[int, dict[str, float]]] | None:
        """A blend ``schedule`` with its steps as example positions (steps × B)."""
        if self.blend is None or "schedule" not in self.blend:
            return None
        return [(int(step) * self.global_batch_size, dict(w))
                for step, w in self.blend["schedule"]]

    def sources(self) -> dict[str, str]:
        """Cache path per source name (``{"": path}`` for a single cache)."""
        if self.blend is None:
            return {"": str(self.cache)}
        return {str(k): str(v) for k, v in self.blend["sources"].items()}

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
        return BatchSampler(n, self.global_batch_size, self.micro_batch_size, world,
                            skip=self.skip_examples())

    def _path(self) -> str:
        return str(self.cache)

    def _blend(self, opened: dict[str, Any]) -> Any:
        from shardwise.read.compose.blend import Blend

        assert self.blend is not None  # for mypy: _blend is called only for a blend
        srcs = self.sources()
        reader = reader_class(ReaderKind.TOKENS)
        parts = [self._call(reader, opened.get(p, p)) for p in srcs.values()]
        schedule = self.schedule_examples()
        weights = None if schedule is not None else {
            n: float(self.blend["weights"].get(n, 0.0)) for n in srcs}
        try:
            return Blend(parts, weights, seed=self.seed, names=list(srcs), schedule=schedule,
                         length=self.blend.get("length"))
        except ConfigError as e:
            raise ConfigError(f"{self.where}: {e}") from None

    def _call(self, cls: Any, *args: Any, **kwargs: Any) -> Any:
        """``cls(*args, seq_len=, seed=, **options, **kwargs)``: the reader maps its
        arguments into its config (an unknown one is a ConfigError naming its fields)."""
        try:
            return cls(*args, seq_len=self.seq_len, seed=self.seed, **self.options, **kwargs)
        except ConfigError as e:
            raise ConfigError(f"{self.where}: {e}") from None

    # -- from a file or a state -----------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "read config",
                  base: Path | None = None) -> ReadConfig:
        """From the JSON object; relative cache paths resolve against ``base``."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: a read config is a JSON object, got "
                              f"{type(d).__name__}")
        missing = [k for k in ("seq_len", *_LAYOUT) if k not in d]
        if missing:
            raise ConfigError(f"{where}: missing {missing}; a read config needs seq_len, "
                              "global_batch_size, micro_batch_size and world_size")
        try:
            reader = ReaderKind.parse(d.get("reader", "tokens"))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        cache, blend = d.get("cache"), d.get("blend")
        if base is not None:
            cache = _resolve(cache, base)
            if isinstance(blend, Mapping) and isinstance(blend.get("sources"), Mapping):
                blend = {**blend, "sources": {k: _resolve(v, base)
                                              for k, v in blend["sources"].items()}}
        return cls(reader, d["seq_len"], d["global_batch_size"], d["micro_batch_size"],
                   d["world_size"], cache=cache, blend=dict(blend) if blend else None,
                   seed=d.get("seed", 0), skip=tuple(d.get("skip") or ()),
                   tokenizer=_resolve(d.get("tokenizer"), base),
                   options={k: v for k, v in d.items() if k not in _TOP}, where=where)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (the inverse of :meth:`from_dict`)."""
        out: dict[str, Any] = {"reader": self.reader.value, "seq_len": self.seq_len,
                               "seed": self.seed, **{k: getattr(self, k) for k in _LAYOUT},
                               **self.options}
        out.update({"cache": self.cache} if self.cache is not None else {"blend": self.blend})
        if self.skip:
            out["skip"] = [list(r) for r in self.skip]
        if self.tokenizer is not None:
            out["tokenizer"] = self.tokenizer
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **given: Any) -> ReadConfig:
        """The config of the run that saved ``state`` (a loader's, a StreamDataset's or a
        PackedSFT's ``state_dict()``). A state holds the reader's config (read back by
        its ``config_class``) but no paths and no batch layout: ``given`` supplies those
        (``cache``, or ``blend={"sources": {name: path}}``, whose mix the state holds;
        ``global_batch_size``, ``micro_batch_size``, ``world_size``) and may override
        any field. :func:`check_state` then proves the rebuilt reader is the saved one."""
        st = LoaderState.from_dict(dict(state) if isinstance(state, Mapping) else state)
        cfg = dict(st.config)
        kind = next((k for k in ReaderKind if getattr(reader_class(k), "state_kind", None)
                     == st.kind), ReaderKind.TOKENS)
        d: dict[str, Any] = {"reader": kind.value}
        if "blend" in cfg:  # a Blend's state (its sources' configs are theirs to give)
            d.update(_blend_from_state(cfg, given))
        else:
            d.update(reader_class(kind).config_class.from_state(cfg))
        skip = cfg.get(SKIP_KEY)
        if skip and "skip" not in given and "global_batch_size" in given:
            d["skip"] = _example_ranges_as_steps(skip, int(given["global_batch_size"]))
        d.update(given)
        blend = d.get("blend")
        missing = [k for k in _LAYOUT if k not in d] + (
            ["cache"] if blend is None and "cache" not in d else
            ["blend.sources"] if isinstance(blend, Mapping) and "sources" not in blend else [])
        if missing:
            raise ConfigError(f"a {st.kind!r} state holds the order, not {missing}: give "
                              f"them (trace --cache PATH, or --blend NAME=PATH ...; "
                              "--global-batch-size B --micro-batch-size M --world-size W)")
        return cls.from_dict(d, where=f"the config of a {st.kind!r} state")


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


def _blend_from_state(cfg: Mapping[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A read config's ``seed`` and ``blend`` (but its sources) from a Blend's state; a
    given ``blend`` adds the sources and may replace the mix."""
    from shardwise.read.compose.schedule import BlendConfig

    c = BlendConfig(**BlendConfig.from_state(cfg))
    blend: dict[str, Any] = {} if c.length is None else {"length": c.length}
    if not c.schedule:
        blend["weights"] = dict(zip(c.names, c.weights, strict=True))
    elif "global_batch_size" in given:  # stage starts are examples; a config counts steps
        b = int(given["global_batch_size"])
        blend["schedule"] = [[0, dict(zip(c.names, c.weights, strict=True))]] + [
            [_as_step(s, b, "blend stage"), dict(zip(c.names, w, strict=True))]
            for s, w in c.schedule]
    mine = dict(given.pop("blend", None) or {})
    if "weights" in mine or "schedule" in mine:  # a mix given replaces the state's
        blend = {k: v for k, v in blend.items() if k not in ("weights", "schedule")}
    return {"seed": c.seed, "blend": {**blend, **mine}}


def check_state(dataset: Any, state: Mapping[str, Any]) -> None:
    """Refuse a state the reader ``dataset`` (built from :meth:`ReadConfig.from_state`)
    did not save: its order fields must be the state's, named when they differ (a
    wrong ``--cache``, ``seq_len`` or seed would trace another run's data)."""
    saved, mine = ({k: v for k, v in dict(c).items() if k not in PLACEMENT_KEYS}
                   for c in (state.get("config", {}), dataset.state_config()))
    diffs = [f"{k}: state has {saved.get(k)!r}, this config has {mine.get(k)!r}"
             for k in sorted(set(saved) | set(mine)) if saved.get(k) != mine.get(k)
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


def _resolve(value: Any, base: Path | None) -> Any:
    if base is None or not isinstance(value, str) or "://" in value or os.path.isabs(value):
        return value
    return str(base / value)


def _example_ranges_as_steps(ranges: Any, b: int) -> list[list[int]]:
    return [[_as_step(a, b, "skip range"), _as_step(z, b, "skip range")] for a, z in ranges]


def _as_step(example: int, b: int, what: str) -> int:
    if example % b:
        raise ConfigError(f"the state's {what} starting or ending at example {example} is not "
                          f"whole steps of global_batch_size={b}; give it in steps")
    return int(example) // b


def _check_blend(blend: Mapping[str, Any], where: str) -> None:
    srcs = blend.get("sources")
    if not isinstance(srcs, Mapping) or not srcs:
        raise ConfigError(f"{where}: blend.sources must map names to cache paths")
    has_w, has_s = "weights" in blend, "schedule" in blend
    if has_w == has_s:
        raise ConfigError(f"{where}: a blend has 'weights' or a 'schedule', exactly one")
    stages = [blend["weights"]] if has_w else [w for _, w in blend["schedule"]]
    for w in stages:
        unknown = set(w) - set(srcs) if isinstance(w, Mapping) else {"(not an object)"}
        if unknown:
            raise ConfigError(f"{where}: blend weights name {sorted(unknown)}, which are not "
                              f"among its sources {sorted(srcs)}")

