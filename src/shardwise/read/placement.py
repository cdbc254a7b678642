"""Placement: where each example of a run's global order goes — which rank, which
micro-batch, which step — as one frozen value, a node of the run's config.

A run reads a dataset (its config holds the order, :mod:`shardwise.read.reader_config`)
*placed* by a sampler. The placement's arguments are this node, made in one place from
a loader's keywords (:meth:`Placement.of`) or given whole (``placement=``); a read config
holds it under ``"placement"`` (:mod:`shardwise.read.config`); and a saved state holds
what the sampler adds to the order's config (:meth:`BatchSampler.state`), which
:meth:`Placement.from_state` reads back — so ``trace`` of a run that used Megatron's
cyclic sampler rebuilds that sampler, not the default one::

    shardwise.torch.loader(ds, global_batch_size=64, micro_batch_size=8, sampler="cyclic")
        == shardwise.torch.loader(ds, placement=Placement(64, 8, sampler="cyclic"))

    a state's config = ds.state_config()        | sampler.state()
                       (the order, fingerprinted)  (the placement: "sampler", "sampler_seed",
                                                    "data_sharding", "world_size", ...)

``world_size`` is a read config's (a tool rebuilding every rank); a loader takes the
job's :class:`~shardwise.world.World` and refuses a placement made for another size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, cast

from shardwise.checkpoint import SKIP_KEY, as_count
from shardwise.errors import ConfigError
from shardwise.read.sampler import (
    BatchSampler,
    SamplerKind,
    accumulation_steps,
    skip_from_steps,
)
from shardwise.world import World


@dataclass(frozen=True)
class Placement:
    """A run's placement (see the module docs): the global and micro batch sizes, the
    sampler (``single``: the dataset's global order; ``cyclic``: Megatron's, with its own
    ``seed`` and ``data_sharding``; ``eval``: one padded pass), the run's length
    (``epochs`` or ``total_samples``; neither: endless), ``skip_steps`` (half-open
    ranges of global steps left out) and, in a read config, ``world_size``."""

    global_batch_size: int
    micro_batch_size: int
    sampler: SamplerKind | str = SamplerKind.SINGLE
    seed: int = 0
    data_sharding: bool = True
    epochs: int | None = None
    total_samples: int | None = None
    skip_steps: tuple[tuple[int, int], ...] = ()
    world_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "micro_batch_size"):
            object.__setattr__(self, name, as_count(getattr(self, name), name, minimum=1,
                                                    error=ConfigError))
        object.__setattr__(self, "sampler", SamplerKind.parse(self.sampler))
        object.__setattr__(self, "seed", as_count(self.seed, "seed", error=ConfigError))
        if not isinstance(self.data_sharding, bool):
            raise ConfigError(f"data_sharding must be true or false, got "
                              f"{self.data_sharding!r}")
        if self.epochs is not None and self.total_samples is not None:
            raise ConfigError("give epochs or total_samples, not both")
        if self.epochs is not None:
            object.__setattr__(self, "epochs", as_count(self.epochs, "epochs", minimum=1,
                                                        error=ConfigError))
        if self.total_samples is not None:
            object.__setattr__(self, "total_samples", as_count(
                self.total_samples, "total_samples", error=ConfigError))
        skip_from_steps(self.skip_steps, self.global_batch_size)  # pairs, 0 <= a < b
        object.__setattr__(self, "skip_steps",
                           tuple(sorted((int(a), int(b)) for a, b in self.skip_steps)))
        if self.world_size is not None:
            object.__setattr__(self, "world_size", as_count(
                self.world_size, "world_size", minimum=1, error=ConfigError))
            accumulation_steps(self.global_batch_size, self.micro_batch_size,
                               self.world_size)

    @classmethod
    def of(cls, placement: Placement | None, *, global_batch_size: int | None = None,
           micro_batch_size: int | None = None, skip_steps: Iterable[Sequence[int]] | None
           = None, **given: Any) -> Placement:
        """The placement of a loader's arguments: ``placement``, or the one its keywords
        name (``global_batch_size`` and ``micro_batch_size`` needed). The keywords of a
        field of a given placement must be left at their defaults: one source for each."""
        sizes = {"global_batch_size": global_batch_size, "micro_batch_size": micro_batch_size}
        skip = tuple(skip_steps or ())  # checked by the placement: pairs, 0 <= a < b
        if placement is None:
            missing = [k for k, v in sizes.items() if v is None]
            if missing:
                raise ConfigError(f"a loader needs {missing} (or placement=Placement(...))")
            return cls(**sizes, skip_steps=skip, **given)  # type: ignore[arg-type]
        if not isinstance(placement, Placement):
            raise ConfigError(f"placement must be a Placement, got {placement!r}")
        defaults = {f.name: f.default for f in fields(cls)}
        both = sorted([k for k, v in sizes.items() if v is not None]
                      + [k for k, v in given.items() if v != defaults[k]]
                      + (["skip_steps"] if skip else []))
        if both:
            raise ConfigError(f"{both} given beside placement=: set them in the Placement")
        return placement

    @property
    def kind(self) -> SamplerKind:
        """``sampler``, parsed by ``__post_init__`` (the field also takes its name)."""
        return cast(SamplerKind, self.sampler)

    def total(self, n: int) -> int | None:
        """Examples of the global order the run serves (None: endless)."""
        return self.total_samples if self.epochs is None else self.epochs * n

    def batch_sampler(self, n: int, world: World, consumed: int = 0) -> BatchSampler:
        """The sampler of rank ``world.rank`` over ``n`` examples an epoch, from
        ``consumed`` (a placement made for another world size is refused)."""
        if self.world_size is not None and self.world_size != world.size:
            raise ConfigError(f"this placement is for world_size={self.world_size}, and the "
                              f"job has {world.size} ranks")
        return BatchSampler(n, self.global_batch_size, self.micro_batch_size, world,
                            self.kind, self.seed, self.data_sharding,
                            as_count(consumed, "consumed"), self.total(n),
                            skip_from_steps(self.skip_steps, self.global_batch_size))

    def to_dict(self) -> dict[str, Any]:
        """The node as a read config writes it (defaults left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("global_batch_size", "micro_batch_size") or v != f.default:
                out[f.name] = (v.value if isinstance(v, SamplerKind) else
                               [list(r) for r in v] if f.name == "skip_steps" else v)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Placement:
        """The node of a read config (``skip`` is ``skip_steps``'s name there)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: placement is a JSON object, got {type(d).__name__}")
        d = {("skip_steps" if k == "skip" else k): v for k, v in d.items()}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{where}: placement takes no {unknown}; its fields are "
                              f"{sorted(names)}")
        try:
            return cls(**d)
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: placement: {e}") from None

    @classmethod
    def from_state(cls, config: Mapping[str, Any], **given: Any) -> dict[str, Any]:
        """The fields a state's config holds (:meth:`BatchSampler.state`), by name; the
        skip ranges (positions) as steps of ``given["global_batch_size"]`` when given."""
        out: dict[str, Any] = {}
        if "sampler" in config:
            out["sampler"] = config["sampler"]
        if "sampler_seed" in config:
            out["seed"] = config["sampler_seed"]
        if "data_sharding" in config:
            out["data_sharding"] = config["data_sharding"]
        skip, b = config.get(SKIP_KEY), given.get("global_batch_size")
        if skip and b is not None:
            out["skip_steps"] = [[as_step(p, int(b), "skip range") for p in r] for r in skip]
        return out


def order_part(config: Mapping[str, Any]) -> dict[str, Any]:
    """A state's config without what its sampler added (:meth:`BatchSampler.state`)."""
    return {k: v for k, v in config.items() if k not in BatchSampler.STATE_KEYS}


def as_step(example: int, b: int, what: str) -> int:
    if int(example) % b:
        raise ConfigError(f"the state's {what} starting or ending at example {example} is not "
                          f"whole steps of global_batch_size={b}; give it in steps")
    return int(example) // b


__all__ = ["Placement", "as_step", "order_part"]
