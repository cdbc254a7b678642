"""Hypothesis strategies that damage a cache's files the way a hostile author, a bad copy
or a bad disk would: byte flips, truncations, and JSON edits (a value replaced by another
type, a negative, a huge int, NaN, unicode, a path out of the cache, deep nesting; a key
dropped or written twice; a list element dropped or repeated)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import strategies as st

Mutation = Callable[[bytes], bytes]


def _deep(n: int) -> Any:
    out: Any = 0
    for _ in range(n):
        out = {"a": out}
    return out


HOSTILE_VALUES: list[Any] = [
    -1, 0, 1, 2**31, 2**63 - 1, 2**63, 2**64 + 7, -(2**63), 1.5, 1e308, "__NaN__",
    "__Infinity__",
    "", "x", "²", "é\u202e", "\x00", "a\nb", "../../../outside", "/etc/passwd",
    "chunks/00000/../../x", "s3://other/bucket", "float64", "records", None, True, False,
    [], [0], {}, {"a": 1}, _deep(40), _deep(300), [[[[[[[[[[]]]]]]]]]],
]


def dumps(value: Any) -> bytes:
    """JSON, with the placeholders ``"__NaN__"`` and ``"__Infinity__"`` written as the
    bare ``NaN`` and ``Infinity`` Python's json module writes (orjson refuses them; the
    placeholders keep hypothesis' drawn values comparable: NaN != NaN)."""
    import json

    text = json.dumps(value, sort_keys=True)
    return text.replace('"__NaN__"', "NaN").replace('"__Infinity__"', "Infinity").encode()


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value of ``doc`` (not the root itself), breadth-first-ish."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*at, k))
            out += _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:12]):
            out.append((*at, i))
            out += _paths(v, (*at, i))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


@st.composite
def json_edit(draw: st.DrawFn) -> Mutation:
    """One edit of a JSON document at a drawn path (a no-op on bytes that do not parse)."""
    kind = draw(st.sampled_from(["replace", "replace", "replace", "near", "drop", "twice",
                                 "duplicate_key"]))
    pick = draw(st.integers(0, 10**6))
    value = draw(st.sampled_from(HOSTILE_VALUES))
    delta = draw(st.sampled_from([-2, -1, 1, 2, 1000]))

    def mutate(data: bytes) -> bytes:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        paths = _paths(doc)
        if not paths:
            return dumps(value)
        path = paths[pick % len(paths)]
        parent, key = _parent(doc, path), path[-1]
        if kind == "replace":
            parent[key] = value
        elif kind == "near":  # a plausible number: off by a little
            old = parent[key]
            parent[key] = old + delta if type(old) is int else value
        elif kind == "drop":
            del parent[key]
        elif kind == "twice" and isinstance(parent, list):
            parent.insert(key, parent[key])
        elif kind == "duplicate_key" and isinstance(parent, dict):
            # the same key twice in one object: the parser keeps the last
            text = dumps(doc).decode()
            inner = dumps(parent).decode()
            twin = inner[:-1] + ("," if len(parent) else "") + \
                f"{dumps(key).decode()}: {dumps(value).decode()}}}"
            return text.replace(inner, twin, 1).encode()
        else:
            parent[key] = value
        return dumps(doc)
    return mutate


@st.composite
def byte_edit(draw: st.DrawFn, head: int | None = None) -> Mutation:
    """A flipped byte, a truncation, or (``head``: within the first ``head`` bytes) a
    little-endian u64 overwritten with a hostile count."""
    kind = draw(st.sampled_from(["flip", "flip", "truncate", "u64"]))
    pick = draw(st.integers(0, 10**6))
    mask = draw(st.integers(1, 255))
    count = draw(st.sampled_from([0, 1, 2**32, 2**63, 2**64 - 1, 7]))

    def mutate(data: bytes) -> bytes:
        if not data:
            return b"\x00"
        span = min(len(data), head) if head else len(data)
        at = pick % span
        if kind == "flip":
            return data[:at] + bytes([data[at] ^ mask]) + data[at + 1:]
        if kind == "truncate":
            return data[:at]
        at = min(at, max(len(data) - 8, 0))
        return data[:at] + struct.pack("<Q", count)[:len(data) - at] + data[at + 8:]
    return mutate


def any_edit(head: int | None = None, *, json: bool = True) -> st.SearchStrategy[Mutation]:
    return st.one_of(json_edit(), byte_edit(head)) if json else byte_edit(head)
