"""What to do with a bad source record: stop naming it, or skip it and count it."""

from __future__ import annotations

from enum import Enum

from shardwise.errors import ConfigError


class OnError(str, Enum):
    """What to do with a bad record: stop naming it, or skip it and count it."""

    RAISE = "raise"
    SKIP = "skip"

    @classmethod
    def parse(cls, value: str | OnError) -> OnError:
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"on_error must be one of {[m.value for m in cls]}, "
                              f"got {value!r}") from None
