"""A blend's schedule as users write it: stages of weights, by source name or position.

A schedule is ``[(start, weights), ...]``: from example ``start`` of the blend's global
order on, the sources mix with ``weights`` (a list, one per source, or a dict by source
name where a missing name means 0). The first stage starts at 0. A read config's blend
node (:class:`BlendNode`) counts in training steps; :meth:`BlendNode.stages` turns those
into examples (``step × global batch size``), the unit of the global order, which does
not depend on the number of ranks::

    [(0, {"web": .7, "code": .3}), (100_000, {"web": .4, "code": .3, "math": .3})]
    with global batch 512  ->  stages from examples 0 and 51_200_000
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError
from shardwise.plan.blend import normalize_weights
from shardwise.read.placement import as_step
from shardwise.read.reader_config import ReaderConfig, staged_field, state_key

Weights: TypeAlias = "Sequence[float] | Mapping[str, float]"
Stages: TypeAlias = "list[tuple[int, npt.NDArray[np.float64]]]"


def weight_vector(weights: Any, names: Sequence[str], where: str) -> npt.NDArray[np.float64]:
    """One normalised weight per source, from a list or a dict by name."""
    if isinstance(weights, Mapping):
        unknown = sorted(set(map(str, weights)) - set(names))
        if unknown:
            raise ConfigError(f"{where}: weights name {unknown}, which are not among its "
                              f"sources {list(names)}")
        weights = [weights.get(n, 0.0) for n in names]
    if not isinstance(weights, Sequence | np.ndarray) or len(weights) != len(names):
        got = len(weights) if isinstance(weights, Sequence | np.ndarray) else repr(weights)
        raise ConfigError(f"{where}: give one weight per dataset: {len(names)} datasets "
                          f"{list(names)}, got {got} weights")
    try:
        return normalize_weights(weights)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def stages_of(weights: Any, schedule: Any, names: Sequence[str]) -> Stages:
    """``[(start, normalised weights), ...]`` from ``weights`` (one stage) or ``schedule``;
    when both are given, the schedule's first stage must hold ``weights``."""
    if schedule is None:
        if weights is None:
            raise ConfigError("a blend needs weights=[...] or schedule=[(0, weights), ...]")
        return [(0, weight_vector(weights, names, "weights"))]
    if isinstance(schedule, str | bytes | Mapping) or not isinstance(schedule, Sequence) \
            or not schedule:
        raise ConfigError(f"schedule must be a non-empty list of (start_example, weights), "
                          f"got {schedule!r}")
    stages: Stages = []
    for k, entry in enumerate(schedule):
        if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) != 2:
            raise ConfigError(f"schedule stage {k} must be (start_example, weights), "
                              f"got {entry!r}")
        start = as_count(entry[0], f"schedule stage {k} start", error=ConfigError)
        if (k == 0 and start != 0) or (stages and start <= stages[-1][0]):
            raise ConfigError(f"schedule stage {k} starts at example {start}: the first "
                              "stage starts at 0 and starts increase")
        stages.append((start, weight_vector(entry[1], names, f"schedule stage {k}")))
    if weights is not None and not np.allclose(weight_vector(weights, names, "weights"),
                                               stages[0][1], rtol=0, atol=1e-12):
        raise ConfigError(f"weights {weights!r} differ from the schedule's first stage "
                          f"{stages[0][1].tolist()}: give one of them")
    return stages


@dataclass(frozen=True)
class BlendConfig(ReaderConfig):
    """What defines a blend's order (fingerprinted with its sources'): the source
    ``names`` (stored as ``blend``), the first stage's normalised ``weights`` (one per
    name), the ``schedule``'s later stages ``((start_example, weights), ...)`` (empty for
    fixed weights; stored :func:`~shardwise.checkpoint.staged`), ``seed`` and the nominal
    ``length`` (``None``: computed from the sources when the blend is made). A Blend's
    keyword arguments, its state's fields and what a read config rebuilds it from
    (:mod:`shardwise.read.reader_config`); :func:`mixture` turns a user's weights or
    schedule into these fields."""

    reader = "Blend"

    names: tuple[str, ...] = field(metadata=state_key("blend"))
    weights: tuple[float, ...]
    seed: int = 0
    length: int | None = None
    schedule: tuple[tuple[int, tuple[float, ...]], ...] = field(default=(),
                                                                metadata=staged_field())

    def __post_init__(self) -> None:
        names = tuple(str(n) for n in self.names)
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"names must be distinct strings, one per source, got "
                              f"{list(names)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.length is not None and (not isinstance(self.length, int) or self.length < 1):
            raise ConfigError(f"length must be a positive integer, got {self.length!r}")
        stages = stages_of(None, [(0, list(self.weights)), *self.schedule], names)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "weights", tuple(stages[0][1].tolist()))
        object.__setattr__(self, "schedule", tuple((s, tuple(w.tolist()))
                                                   for s, w in stages[1:]))

    def stages(self) -> Stages:
        """``[(start, weights), ...]`` from example 0 on."""
        return [(0, np.asarray(self.weights)),
                *((s, np.asarray(w, dtype=np.float64)) for s, w in self.schedule)]


def mixture(sources: int, weights: Any, schedule: Any, names: Sequence[str] | None
            ) -> dict[str, Any]:
    """A Blend's ``weights`` or ``schedule`` (by name or position) and ``names`` (default
    ``source0``, ``source1``, ...) as :class:`BlendConfig` fields."""
    names = [str(n) for n in names] if names is not None else [
        f"source{j}" for j in range(sources)]
    if len(names) != sources or len(set(names)) != sources:
        raise ConfigError(f"names must be {sources} distinct strings, got {names}")
    stages = stages_of(weights, schedule, names)
    return {"names": tuple(names), "weights": tuple(stages[0][1].tolist()),
            "schedule": tuple((s, tuple(w.tolist())) for s, w in stages[1:])}


def planned_mix(stages: Stages, start: int, stop: int) -> npt.NDArray[np.float64]:
    """Each source's planned share of examples ``[start, stop)``: the stages' weights
    averaged over their overlap with the range. The blend realises it to within one
    example per source and stage (the rule's guarantee); no example is computed."""
    if stop <= start:
        raise ConfigError(f"an empty range [{start}, {stop})")
    total = np.zeros_like(stages[0][1])
    ends = [s for s, _ in stages[1:]] + [max(stop, stages[-1][0])]
    for (s, w), e in zip(stages, ends, strict=True):
        overlap = min(e, stop) - max(s, start)
        if overlap > 0:
            total += overlap * w
    return total / (stop - start)


def mix_by_steps(stages: Stages, names: Sequence[str], global_batch_size: int, steps: int,
                 rows: int = 24) -> list[tuple[str, dict[str, float]]]:
    """``(label, {name: share})`` for at most ``rows`` buckets of consecutive steps of a
    run of ``steps`` steps: what ``inspect --plot`` draws."""
    per = max(1, -(-steps // rows))
    out = []
    for a in range(0, steps, per):
        b = min(a + per, steps)
        share = planned_mix(stages, a * global_batch_size, b * global_batch_size)
        label = f"step {a}" if b == a + 1 else f"steps {a}-{b - 1}"
        out.append((label, {n: float(x) for n, x in zip(names, share, strict=True) if x}))
    return out


# -- a read config's blend node (shardwise.read.config) ----------------------------------
Mix: TypeAlias = "tuple[tuple[str, float], ...]"


@dataclass(frozen=True)
class BlendNode:
    """A read config's ``blend`` node, as its ``placement`` is a
    :class:`~shardwise.read.placement.Placement`: the ``sources`` (name → cache path, in
    the blend's order), the mix — fixed ``weights`` by name, or a ``schedule`` of
    ``(global step, weights)`` stages from step 0: exactly one — and the nominal
    ``length`` (``None``: the sources' sum). A stage's weights keep the names given, in
    the sources' order (a name left out weighs 0), and are checked as the Blend will take
    them. Its JSON (:meth:`to_dict`)::

        {"sources": {"web": "web/", "code": "code/"}, "weights": {"web": 0.7, "code": 0.3}}
        {"sources": {...}, "schedule": [[0, {"web": 1.0}], [500, {"web": 0.5, "code": 0.5}]],
         "length": 100000}
    """

    sources: tuple[tuple[str, str], ...]
    weights: Mix | None = None
    schedule: tuple[tuple[int, Mix], ...] | None = None
    length: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", _sources(self.sources))
        if (self.weights is None) == (self.schedule is None):
            raise ConfigError("a blend has 'weights' or a 'schedule', exactly one; got "
                              + ("both" if self.weights is not None else "neither"))
        if self.weights is not None:
            object.__setattr__(self, "weights", _mix(self.weights, self.names,
                                                     "blend.weights"))
        else:
            object.__setattr__(self, "schedule", _stages(self.schedule, self.names))
        if self.length is not None:
            object.__setattr__(self, "length", as_count(self.length, "blend.length",
                                                        minimum=1, error=ConfigError))

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names, in the blend's order."""
        return tuple(n for n, _ in self.sources)

    def paths(self) -> dict[str, str]:
        """Cache path by source name, in the blend's order."""
        return dict(self.sources)

    def stages(self, global_batch_size: int) -> list[tuple[int, dict[str, float]]]:
        """The mix as a Blend's ``schedule=``: ``(start example, {name: weight})``, a
        stage's step × ``global_batch_size`` (fixed weights: one stage from 0, which the
        Blend takes as those weights)."""
        steps = self.schedule if self.schedule is not None else (
            (0, cast(Mix, self.weights)),)
        return [(step * global_batch_size, dict(w)) for step, w in steps]

    def to_dict(self) -> dict[str, Any]:
        """The node as a read config writes it: ``sources``, ``weights`` or ``schedule``
        (each stage's weights an object by name), ``length`` when set."""
        out: dict[str, Any] = {"sources": dict(self.sources)}
        if self.schedule is None:
            out["weights"] = dict(cast(Mix, self.weights))
        else:
            out["schedule"] = [[step, dict(w)] for step, w in self.schedule]
        if self.length is not None:
            out["length"] = self.length
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str) -> BlendNode:
        """The node of a read config (errors start with ``where`` and name the field)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: blend is a JSON object ({{\"sources\": ..., "
                              f"\"weights\": ...}}), got {type(d).__name__}")
        unknown = sorted(set(d) - {"sources", "weights", "schedule", "length"})
        if unknown:
            raise ConfigError(f"{where}: blend takes no {unknown}; its fields are "
                              "['length', 'schedule', 'sources', 'weights']")
        try:
            return cls(d.get("sources"), d.get("weights"),  # type: ignore[arg-type]
                       d.get("schedule"), d.get("length"))  # checked by __post_init__
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    @classmethod
    def from_state(cls, cfg: Mapping[str, Any], given: dict[str, Any]
                   ) -> tuple[int, dict[str, Any]]:
        """A Blend's ``seed`` (its reader's in a read config) and this node's JSON from the
        Blend's state: the mix by name (a schedule's examples as steps of
        ``given["global_batch_size"]``) and ``length``. ``given["blend"]``, taken out of
        ``given``, adds the sources (a state holds only their fingerprints) and may
        replace the mix. JSON, not a node: what is missing (the sources, the batch
        layout) :meth:`ReadConfig.from_state` names with the rest of what to give."""
        c = BlendConfig(**BlendConfig.from_state(cfg))
        mine = dict(given.pop("blend", None) or {})
        node: dict[str, Any] = {}
        if "weights" in mine or "schedule" in mine:
            pass  # a mix given replaces the state's
        elif not c.schedule:
            node["weights"] = dict(zip(c.names, c.weights, strict=True))
        elif "global_batch_size" in given:  # stage starts are examples; a config counts steps
            b = int(given["global_batch_size"])
            node["schedule"] = [[as_step(s, b, "blend stage"), dict(zip(c.names, w,
                                                                         strict=True))]
                                for s, w in ((0, c.weights), *c.schedule)]
        if c.length is not None:
            node["length"] = c.length
        return c.seed, {**node, **mine}


def _pairs(value: Any) -> bool:
    """Whether ``value`` is the stored form of a mapping: a tuple of ``(key, value)``."""
    return isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2
                                            for p in value)


def _sources(given: Any) -> tuple[tuple[str, str], ...]:
    """``(name, path)`` pairs, in order, from a mapping (or the pairs themselves)."""
    pairs = list(given.items()) if isinstance(given, Mapping) else (
        list(given) if _pairs(given) else [])
    if not pairs:
        raise ConfigError(f"blend.sources must map names to cache paths (e.g. "
                          f"{{\"web\": \"web/\"}}), got {given!r}")
    bad = {n: p for n, p in pairs
           if not isinstance(n, str) or not isinstance(p, str | os.PathLike)}
    if bad:
        raise ConfigError(f"blend.sources: a source is a name and a cache path (strings), "
                          f"got {bad!r}")
    if len({n for n, _ in pairs}) != len(pairs):
        raise ConfigError(f"blend.sources: names must be distinct, got {[n for n, _ in pairs]}")
    return tuple((n, str(p)) for n, p in pairs)


def _mix(given: Any, names: Sequence[str], where: str) -> Mix:
    """One stage's weights by name, in the sources' order, checked as a Blend checks them
    (names among the sources, finite, >= 0, one > 0)."""
    w = dict(given) if _pairs(given) else given
    if not isinstance(w, Mapping):
        raise ConfigError(f"{where} must be an object of weights by source name (e.g. "
                          f"{{{names[0]!r}: 1}}), got {given!r}")
    bad = {n: x for n, x in w.items() if isinstance(x, bool) or not isinstance(x, Real)}
    if bad:
        raise ConfigError(f"{where}: a weight is a number, got {bad}")
    weight_vector(w, names, where)
    return tuple((n, float(w[n])) for n in names if n in w)


def _stages(given: Any, names: Sequence[str]) -> tuple[tuple[int, Mix], ...]:
    """``(step, weights)`` stages from step 0, steps increasing."""
    if isinstance(given, str | bytes) or not isinstance(given, Sequence) or not given:
        raise ConfigError(f"blend.schedule must be a non-empty list of [step, {{name: "
                          f"weight}}] stages, got {given!r}")
    out: list[tuple[int, Mix]] = []
    for k, stage in enumerate(given):
        where = f"blend.schedule stage {k}"
        if isinstance(stage, str | bytes) or not isinstance(stage, Sequence) or len(stage) != 2:
            raise ConfigError(f"{where} must be [step, {{name: weight}}], got {stage!r}")
        step = as_count(stage[0], f"{where}'s step", error=ConfigError)
        if (k == 0 and step != 0) or (out and step <= out[-1][0]):
            raise ConfigError(f"{where} starts at step {step}: the first stage starts at "
                              "step 0 and steps increase")
        out.append((step, _mix(stage[1], names, where)))
    return tuple(out)
