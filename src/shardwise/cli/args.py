"""Argument types shared by the commands: whole numbers with a lower bound.

Why one module: every command that takes a count (``--seq-len``, ``--chunk-docs``,
``--steps``) should refuse the same inputs with the same words; the integer rule itself
is :func:`~shardwise.checkpoint.as_count`'s. argparse turns the refusal into a usage
error (exit 2) naming the option.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from shardwise.checkpoint import as_count
from shardwise.errors import ConfigError


def count_arg(minimum: int = 1) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer of at least ``minimum``."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            return as_count(int(text), "value", minimum=minimum, error=ConfigError)
        except ValueError:  # int() of a non-number, or below the minimum (ConfigError)
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}") from None
    return parse


def positive_float(text: str) -> float:
    """An argparse ``type=`` for a number above zero."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


__all__ = ["count_arg", "positive_float"]
