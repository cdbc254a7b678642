"""How the chunk files of a producer directory are named: index ↔ file name.

Two forms, because producers come with either:

* a **format** pattern, ``"chunk_{index:05d}.jsonl"``: the name of chunk ``i`` is computed,
  and a listed name counts only if formatting its index gives it back (``chunk_7.jsonl``
  is not chunk 7 of ``chunk_{index:05d}.jsonl``);
* a **regex** with one capture group, ``r"chunk_(\\d+)\\.jsonl"`` (ms-swift's form): a name
  is a chunk when the regex matches it *whole* (``fullmatch``, so ``chunk_7.jsonl.completed``
  and ``.tmp-chunk_7.jsonl`` are not chunks), and the name of chunk ``i`` is found by
  listing the directory. Two names with the same index (``chunk_7.jsonl`` and
  ``chunk_007.jsonl``) are refused: which one is chunk 7 would depend on ``listdir``.

A name learnt once is remembered, so a chunk the producer deleted after its done marker is
still known by name (the marker ``<name><marker>`` names it too after a restart).
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

from shardwise.errors import ConfigError

DEFAULT_PATTERN = "chunk_{index:05d}.jsonl"


def _format_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    for literal, field, _spec, _conv in string.Formatter().parse(pattern):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(r"(\d+)")
    return re.compile("".join(parts))


class ChunkNames:
    """Index ↔ name for one ``pattern`` (a format string with ``{index}``, or a regex with
    one capture group, as a string or compiled)."""

    def __init__(self, pattern: str | re.Pattern[str]) -> None:
        self.pattern = pattern
        self._fmt = pattern if isinstance(pattern, str) and "{index" in pattern else None
        self.is_format = self._fmt is not None
        if isinstance(pattern, str) and self._fmt is not None:
            if pattern.format(index=0) == pattern.format(index=1):
                raise ConfigError(f"pattern must contain an {{index}} field such as "
                                  f"{DEFAULT_PATTERN!r}, got {pattern!r}")
            self.regex = _format_regex(pattern)
        else:
            try:
                self.regex = re.compile(pattern)
            except (re.error, TypeError) as e:
                raise ConfigError(f"chunk pattern {pattern!r} is neither a format string "
                                  f"with {{index}} ({DEFAULT_PATTERN!r}) nor a valid regex: "
                                  f"{e}") from None
            if self.regex.groups != 1:
                raise ConfigError(f"pattern must contain an {{index}} field "
                                  f"({DEFAULT_PATTERN!r}) or be a regex with exactly one "
                                  "capture group for the chunk index "
                                  f"(r'chunk_(\\d+)\\.jsonl'); {self.regex.pattern!r} has "
                                  f"{self.regex.groups} groups")
        self._known: dict[int, str] = {}

    @property
    def text(self) -> str:
        """The pattern as a string (for configs, fingerprints and messages)."""
        return self.pattern if isinstance(self.pattern, str) else self.pattern.pattern

    def _index(self, name: str) -> int | None:
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        try:
            index = int(m.group(1))
        except (TypeError, ValueError):
            raise ConfigError(f"chunk pattern {self.text!r} matched {name!r} but its capture "
                              f"group {m.group(1)!r} is not an integer") from None
        if self._fmt is not None and self._fmt.format(index=index) != name:
            return None
        return index

    def _learn(self, directory: Path, index: int, name: str) -> None:
        seen = self._known.setdefault(index, name)
        if seen != name:
            raise ConfigError(f"{directory}: {seen!r} and {name!r} both match the chunk "
                              f"pattern {self.text!r} with index {index}; which one is chunk "
                              f"{index} would be a guess. Remove one or make the pattern "
                              "stricter")

    def indices(self, directory: str | os.PathLike[str], marker: str | None = None
                ) -> list[int]:
        """The indices of the chunks in ``directory`` now, ascending. With ``marker`` (a
        done-marker suffix), names of consumed chunks are learnt from their markers too."""
        d = Path(directory)
        found = set()
        for name in os.listdir(d):
            index = self._index(name)
            if index is not None:
                if not self.is_format:
                    self._learn(d, index, name)
                found.add(index)
            elif marker and name.endswith(marker) and not self.is_format:
                index = self._index(name[: -len(marker)])
                if index is not None:
                    self._learn(d, index, name[: -len(marker)])
        return sorted(found)

    def name(self, directory: str | os.PathLike[str], index: int,
             marker: str | None = None) -> str | None:
        """The file name of chunk ``index``; ``None`` for a regex pattern while no file of
        that index (or its marker) has been listed."""
        if self._fmt is not None:
            return self._fmt.format(index=index)
        if index not in self._known:
            self.indices(directory, marker)
        return self._known.get(index)

    def describe(self, index: int) -> str:
        """How messages name chunk ``index`` before its file exists."""
        if self._fmt is not None:
            return self._fmt.format(index=index)
        return f"chunk {index} (a file matching {self.text!r})"
