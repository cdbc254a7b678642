"""Field keys: ``text`` names a field, ``meta.body`` a field of a nested object.

A key is first looked up as it is (a flattened column is named ``meta.body``:
``datasets``' ``flatten()``), then as a path of dots through nested JSON objects or
Parquet / Arrow structs::

    {"meta.body": "a"}            key "meta.body" → "a"    (the name as it is)
    {"meta": {"body": "b"}}       key "meta.body" → "b"    (a path)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MISSING = object()


def lookup(record: dict[str, Any], key: str) -> tuple[Any, str]:
    """``(value, "")``, or ``(MISSING, why)`` naming the fields that are there."""
    if key in record:
        return record[key], ""
    value: Any = record
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(value, dict) or part not in value:
            where = ".".join(parts[:depth])
            if not isinstance(value, dict):
                return MISSING, f"{where!r} is {type(value).__name__}, not an object"
            fields = sorted(value)[:10]
            return MISSING, f"fields of {where!r}: {fields}" if where else f"fields: {fields}"
        value = value[part]
    return value, ""


def top_columns(names: Sequence[str], keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """The top-level columns that hold ``keys`` (a key as it is, else the first part of
    its path), and the keys found in neither form."""
    out: list[str] = []
    missing: list[str] = []
    for key in keys:
        top = key if key in names else key.split(".", 1)[0]
        if top not in names:
            missing.append(key)
        elif top not in out:
            out.append(top)
    return out, missing
