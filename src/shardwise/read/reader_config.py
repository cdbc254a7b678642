"""The one config a reader is built from.

Each reader's order is a frozen dataclass (TokenConfig, StreamConfig, SftConfig,
BlendConfig) deriving from :class:`ReaderConfig`. That dataclass is the one mapping of
"what a run reads":

* **arguments** — a reader's keyword arguments that are not about *where* or *how fast*
  (world, cache paths, prefetch, timeouts) are its config's fields, turned into the config
  in one place, :meth:`ReaderConfig.of`;
* **state and fingerprint** — :meth:`ReaderConfig.state` is the fields as a state's
  ``config`` holds them, to which the reader adds only identity (its data's fingerprint)
  and version fields; ``fingerprint()`` hashes that;
* **rebuilding** — :meth:`ReaderConfig.from_state` reads the fields back from a saved
  state's config, so ``ReadConfig.from_state`` and ``trace`` rebuild any reader the same way.

So a new reader argument is one new field. A field whose state key is not its name (an
argument renamed after states were saved) says so in its metadata, :func:`state_key`; a
value that may change for positions after a state's (a blend schedule's later stages) is
:func:`staged_field` — both beside the field, never in a table elsewhere::

    @dataclass(frozen=True)
    class SftConfig(ReaderConfig):
        seq_len: int
        group_size: int = field(default=1024, metadata=state_key("window"))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, fields, replace
from enum import Enum
from typing import Any, ClassVar, TypeVar

from shardwise.checkpoint import STAGED, fingerprint, staged
from shardwise.errors import ConfigError

C = TypeVar("C", bound="ReaderConfig")
_KEY, _STAGED = "state_key", "staged"


def state_key(name: str) -> dict[str, Any]:
    """Field metadata: the field is stored under ``name`` in a state's config."""
    return {_KEY: name}


def staged_field() -> dict[str, Any]:
    """Field metadata: a tuple of ``(start, value)`` entries stored as
    :func:`~shardwise.checkpoint.staged` (absent when empty), so entries starting after a
    state's position may change on resume."""
    return {_STAGED: True}


def plain(value: Any) -> Any:
    """A field's value as plain JSON: an option enum by its value, tuples as lists."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


class ReaderConfig:
    """Base of the frozen dataclasses readers are built from (see the module docs)."""

    reader: ClassVar[str] = "reader"  # the reader's name, for errors

    @classmethod
    def of(cls: type[C], config: C | None, options: Mapping[str, Any]) -> C:
        """The one place a reader's keyword arguments become its config: ``config`` with
        ``options`` replacing fields, or the config of ``options`` alone. A name that is no
        field, or a missing required one, is a ConfigError naming the fields."""
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ConfigError(f"{cls.reader} takes no argument {unknown}: its order's "
                              f"arguments are {names} ({cls.__name__}'s fields)")
        if config is not None:
            if not isinstance(config, cls):
                raise ConfigError(f"{cls.reader}: config must be a {cls.__name__}, got "
                                  f"{config!r} (its fields are keyword arguments)")
            return replace(config, **options) if options else config  # type: ignore[type-var]
        missing = [f.name for f in fields(cls)  # type: ignore[arg-type]
                   if f.default is MISSING and f.default_factory is MISSING
                   and f.name not in options]
        if missing:
            raise ConfigError(f"{cls.reader} needs {missing} (or config={cls.__name__}(...))")
        return cls(**options)

    @classmethod
    def argument_names(cls) -> set[str]:
        """The keyword arguments of a reader that :meth:`of` takes into this config (a
        reader's others are about where and how fast it reads, not what)."""
        return {f.name for f in fields(cls)}  # type: ignore[arg-type]

    def state(self) -> dict[str, Any]:
        """The fields as a state's config holds them (plain JSON, under their state keys)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = plain(getattr(self, f.name))
            if f.metadata.get(_STAGED):
                if not value:
                    continue  # absent when empty, so states without entries keep their prints
                value = staged(value)
            out[_key(f)] = value
        return out

    @classmethod
    def from_state(cls, config: Mapping[str, Any]) -> dict[str, Any]:
        """The fields a state's ``config`` holds, by field name (what :meth:`of` takes);
        the keys that are no field (identity, versions, placement) are left out."""
        out: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if _key(f) not in config:
                continue
            value = config[_key(f)]
            if f.metadata.get(_STAGED):
                value = value.get(STAGED, []) if isinstance(value, Mapping) else value
            out[f.name] = value
        return out

    def options(self) -> dict[str, Any]:
        """The fields by name, as plain JSON (what a read config writes)."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


def _key(f: Field[Any]) -> str:
    return str(f.metadata.get(_KEY, f.name))


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


__all__ = ["ReaderConfig", "plain", "source_identity", "staged_field", "state_key"]
