"""String options with a fixed set of values, parsed in one place.

A ``Choice`` is a ``str`` enum whose ``parse`` accepts a member or its value and otherwise
raises a :class:`~shardwise.errors.ConfigError` built from the members, so the message
cannot drift from the code::

    class Shuffle(Choice):
        __option__ = "shuffle"
        NONE = "none"
        WINDOW = "window"

    Shuffle.parse("window") is Shuffle.WINDOW
    Shuffle.parse("random")  ->  ConfigError: shuffle must be one of ['none', 'window'], got …
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from shardwise.errors import ConfigError

C = TypeVar("C", bound="Choice")


class Choice(str, Enum):
    """Base of shardwise's option enums; subclasses set ``__option__`` (the argument name)."""

    @classmethod
    def parse(cls: type[C], value: Any) -> C:
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            option = getattr(cls, "__option__", cls.__name__)
            raise ConfigError(f"{option} must be one of {[m.value for m in cls]}, "
                              f"got {value!r}") from None
