"""What to do with a bad source record: stop naming it, or skip it and count it."""

from __future__ import annotations

from shardwise.choice import Choice


class OnError(Choice):
    """What to do with a bad record: stop naming it, or skip it and count it."""

    __option__ = "on_error"

    RAISE = "raise"
    SKIP = "skip"

