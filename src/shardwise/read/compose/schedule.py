"""A blend's schedule as users write it: stages of weights, by source name or position.

A schedule is ``[(start, weights), ...]``: from example ``start`` of the blend's global
order on, the sources mix with ``weights`` (a list, one per source, or a dict by source
name where a missing name means 0). The first stage starts at 0. A read config counts in
training steps; ``ReadConfig.schedule_examples`` turns those into examples (``step ×
global batch size``), the unit of the global order, which does not depend on the number
of ranks::

    [(0, {"web": .7, "code": .3}), (100_000, {"web": .4, "code": .3, "math": .3})]
    with global batch 512  ->  stages from examples 0 and 51_200_000
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

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
            raise ConfigError(f"{where}: weights name {unknown}, which are not sources of "
                              f"this blend {list(names)}")
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
def blend_from_state(cfg: Mapping[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A read config's blend node: ``seed`` and ``blend`` (but its sources) from a Blend's state; a
    given ``blend`` adds the sources and may replace the mix."""
    c = BlendConfig(**BlendConfig.from_state(cfg))
    blend: dict[str, Any] = {} if c.length is None else {"length": c.length}
    if not c.schedule:
        blend["weights"] = dict(zip(c.names, c.weights, strict=True))
    elif "global_batch_size" in given:  # stage starts are examples; a config counts steps
        b = int(given["global_batch_size"])
        blend["schedule"] = [[0, dict(zip(c.names, c.weights, strict=True))]] + [
            [as_step(s, b, "blend stage"), dict(zip(c.names, w, strict=True))]
            for s, w in c.schedule]
    mine = dict(given.pop("blend", None) or {})
    if "weights" in mine or "schedule" in mine:  # a mix given replaces the state's
        blend = {k: v for k, v in blend.items() if k not in ("weights", "schedule")}
    return {"seed": c.seed, "blend": {**blend, **mine}}


def check_blend(blend: Mapping[str, Any], where: str) -> None:
    """A read config's blend node: sources, and weights or a schedule naming them."""
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
