"""Old names of public arguments, kept working for a while with a warning.

Why: a renamed argument (one name per concept: ``map_fn`` for every reader's function,
``window`` only for token windows) must not break code written against the old name; it
warns, names the new one, and refuses a call that gives both.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from shardwise.errors import ConfigError

T = TypeVar("T")


def renamed(old: str, old_value: T | None, new: str, new_value: T, where: str, *,
            default: T | None = None) -> T:
    """``new_value``, or ``old_value`` (with a DeprecationWarning) when only the old name
    was given. ``old_value`` is ``None`` when the caller did not pass the old name;
    ``new_value == default`` when it did not pass the new one."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise ConfigError(f"{where}: {old}= is the old name of {new}=; pass only {new}=")
    warnings.warn(f"{where}({old}=...) is deprecated: use {new}= (the same meaning)",
                  DeprecationWarning, stacklevel=3)
    return old_value


def renamed_method(old: str, new: str) -> Callable[..., Any]:
    """A method ``old`` that warns and calls ``new`` (a class attribute:
    ``shuffle = renamed_method("shuffle", "set_epoch")``)."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{type(self).__name__}.{old}() is deprecated: use {new}() (the same "
                      "meaning)", DeprecationWarning, stacklevel=2)
        return getattr(self, new)(*args, **kwargs)

    method.__name__ = method.__qualname__ = old
    method.__doc__ = f"Deprecated: the old name of :meth:`{new}`."
    return method


__all__ = ["renamed", "renamed_method"]
