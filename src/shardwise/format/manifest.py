"""The manifest: what a cache is (format, tokenizer, processor, chunking, sources).

Written once when a build starts and never changed after; a build against an existing
cache compares its own manifest with the stored one and refuses on any difference in
:meth:`Manifest.identity`. The ledger records the xxh3-64 of the manifest's bytes
(:func:`manifest_checksum`), so an edited ``eod_id`` or ``vocab_size`` is refused by
:meth:`Manifest.load` and reported by ``verify``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson

from shardwise.errors import ManifestError
from shardwise.format.checksum import bytes_checksum
from shardwise.format.chunk import ChunkKind
from shardwise.format.files import Files
from shardwise.format.megatron import dtype_code
from shardwise.format.paths import redact_url

FORMAT_VERSION = 1
_TYPES = {"tokenizer.fingerprint": str, "dtype": str, "chunk_kind": str, "processor": dict,
          "chunking": dict, "on_error": str, "created_by": str}
MANIFEST_NAME = "manifest.json"


# the ``format`` of a source imported as a token array (shardwise convert --from-megatron,
# --from-numpy): its positions count documents ("row"), not bytes or Parquet rows
IMPORTED_FORMATS = ("megatron", "numpy")


@dataclass(frozen=True)
class SourceInfo:
    """One input file: its path as given, byte size, sampled content fingerprint, format."""

    path: str
    size: int
    fingerprint: str
    format: str

    @property
    def shown(self) -> str:
        """``path`` as shardwise stores and prints it: a URL without its credentials
        (:func:`~shardwise.format.paths.redact_url`); the build reads ``path``."""
        return redact_url(self.path)


@dataclass(frozen=True)
class TokenizerInfo:
    fingerprint: str
    vocab_size: int
    eod_id: int | None


@dataclass(frozen=True)
class Manifest:
    """Identity of a cache. ``chunk_kind`` is ``tokens`` (Megatron) or ``records`` (Parquet)."""

    tokenizer: TokenizerInfo
    dtype: str
    chunk_kind: str
    processor: dict[str, Any]
    chunking: dict[str, Any]
    sources: list[SourceInfo]
    on_error: str = "raise"
    format_version: int = FORMAT_VERSION
    created_by: str = field(default="", compare=False)

    def identity(self) -> dict[str, Any]:
        """The fields that must match for a build to resume into this cache."""
        d = asdict(self)
        d.pop("created_by")
        return d

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = MANIFEST_NAME) -> Manifest:
        try:
            d = dict(d)
            version = d.get("format_version")
            if version != FORMAT_VERSION:
                raise ManifestError(f"{where}: format_version {version!r}, this shardwise "
                                    f"reads {FORMAT_VERSION}; upgrade shardwise or rebuild")
            d["tokenizer"] = TokenizerInfo(**d["tokenizer"])
            d["sources"] = [SourceInfo(**s) for s in d["sources"]]
            manifest = cls(**d)
            _check(manifest)
            return manifest
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # ConfigError too
            raise ManifestError(f"{where}: not a valid shardwise manifest ({e})") from e

    def save(self, root: Files) -> None:
        root.write(MANIFEST_NAME, self.to_json())

    @classmethod
    def load(cls, root: Files, *, xxh3: str = "") -> Manifest:
        """The manifest of ``root``; with ``xxh3`` (the ledger's ``manifest_xxh3``) its
        bytes must have that checksum."""
        path = root.name(MANIFEST_NAME)
        try:
            raw = root.read(MANIFEST_NAME)
        except FileNotFoundError:
            raise ManifestError(f"{root.location}: no {MANIFEST_NAME}; not a shardwise cache "
                                "(for a Megatron dataset pass its prefix, without .bin/.idx)"
                                ) from None
        if xxh3 and bytes_checksum(raw) != xxh3:
            raise ManifestError(f"{path}: xxh3_64 {bytes_checksum(raw)}, the ledger says "
                                f"{xxh3}: the manifest was edited or damaged after the build "
                                "(it never changes); restore it from a copy or rebuild")
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise ManifestError(f"{path}: invalid JSON ({e})") from e
        return cls.from_dict(data, where=path)


def manifest_checksum(root: Files) -> str:
    """The xxh3-64 of ``root``'s manifest bytes, as the ledger records it."""
    return bytes_checksum(root.read(MANIFEST_NAME))


def describe_differences(stored: dict[str, Any], wanted: dict[str, Any], prefix: str = ""
                         ) -> list[str]:
    """Human lines naming each field that differs between two identity dicts."""
    lines: list[str] = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key), wanted.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            lines += describe_differences(a, b, prefix=f"{name}.")
        elif a != b:
            if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
                for i, (x, y) in enumerate(zip(a, b, strict=True)):
                    if x != y:
                        lines.append(f"{name}[{i}]: cache has {x!r}, this build has {y!r}")
            else:
                lines.append(f"{name}: cache has {a!r}, this build has {b!r}")
    return lines


def _check(m: Manifest) -> None:
    """What a reader uses of a manifest, checked before use (a cache is untrusted input):
    field types, an integer token dtype with a Megatron code, a known chunk kind, a
    positive vocabulary holding the end-of-document id. ValueError or TypeError."""
    for name, kind in _TYPES.items():
        value = m.tokenizer.fingerprint if name.startswith("tokenizer.") else getattr(m, name)
        if not isinstance(value, kind):
            raise TypeError(f"{name} is {value!r:.60}, expected {kind.__name__}")
    dtype = np.dtype(m.dtype)
    if dtype.kind not in "ui":
        raise ValueError(f"dtype {m.dtype!r} is not an integer token dtype")
    dtype_code(dtype)
    if m.chunk_kind not in {k.value for k in ChunkKind}:
        raise ValueError(f"chunk_kind {m.chunk_kind!r}, expected one of "
                         f"{[k.value for k in ChunkKind]}")
    vocab, eod = m.tokenizer.vocab_size, m.tokenizer.eod_id
    if type(vocab) is not int or vocab <= 0:
        raise ValueError(f"tokenizer.vocab_size {vocab!r}, expected a positive integer")
    if eod is not None and (type(eod) is not int or not 0 <= eod < vocab):
        raise ValueError(f"tokenizer.eod_id {eod!r}, expected an id below {vocab} or null")
    for s in m.sources:
        if not (isinstance(s.path, str) and type(s.size) is int and s.size >= 0
                and isinstance(s.fingerprint, str) and isinstance(s.format, str)):
            raise ValueError(f"source {s!r:.100}: expected path, size >= 0, fingerprint, "
                             "format")

