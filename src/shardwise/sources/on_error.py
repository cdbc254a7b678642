"""What to do with a bad source record: stop naming it, or skip it and count it.

A *record* is skipped and counted under ``skip``; a whole source file that cannot be read
as its format (a 0-byte or garbage Parquet file, whose footer does not parse) has no
records to count, so it is an :class:`~shardwise.errors.InputError` naming the file under
either choice (reason ``unreadable_file``): skipping it would drop a whole source from the
cache unannounced (contract 7). Replace the file or leave it out of the sources."""

from __future__ import annotations

from shardwise.choice import Choice


class OnError(Choice):
    """What to do with a bad record: stop naming it, or skip it and count it."""

    __option__ = "on_error"

    RAISE = "raise"
    SKIP = "skip"

