"""Finding sources, fingerprinting them, and cutting them into segments.

A **segment** is the unit of build work: a newline-aligned byte range of an uncompressed
JSONL file (a segment owns every line that *starts* inside it), one row group of a Parquet
file, a range of rows of an Arrow file (Hugging Face ``datasets``' files), or a whole
compressed file. Segment boundaries depend only on the file (its size
and bytes), never on the number of workers, so the chunks of a cache are the same
whatever the parallelism.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from shardwise.errors import ConfigError
from shardwise.format.ledger import Segment
from shardwise.format.manifest import SourceInfo
from shardwise.format.paths import redact_url
from shardwise.remote.client import is_url
from shardwise.sources import hf
from shardwise.sources.bucket import (
    Options,
    expand_url,
    line_probes,
    object_exists,
    object_size,
    open_source,
    read_samples,
)

MIN_SEGMENT_BYTES = 4 << 20
MAX_SEGMENTS_PER_FILE = 256
_FINGERPRINT_SAMPLE = 1 << 20


class SourceFormat(str, Enum):
    JSONL = "jsonl"
    JSONL_GZ = "jsonl.gz"
    JSONL_ZST = "jsonl.zst"
    PARQUET = "parquet"
    ARROW = "arrow"

    @property
    def by_rows(self) -> bool:
        """Positions in the file are rows (Parquet, Arrow), not bytes (JSONL)."""
        return self in (SourceFormat.PARQUET, SourceFormat.ARROW)

    @property
    def unit(self) -> str:
        return "row" if self.by_rows else "byte"


_SUFFIXES = {
    ".jsonl": SourceFormat.JSONL, ".json": SourceFormat.JSONL, ".ndjson": SourceFormat.JSONL,
    ".jsonl.gz": SourceFormat.JSONL_GZ, ".json.gz": SourceFormat.JSONL_GZ,
    ".jsonl.zst": SourceFormat.JSONL_ZST, ".json.zst": SourceFormat.JSONL_ZST,
    ".parquet": SourceFormat.PARQUET, ".arrow": SourceFormat.ARROW,
}
ACCEPTED = (".jsonl, .json, .ndjson (also .gz, .zst), .parquet and .arrow files; a folder "
            "of them; a folder saved by datasets' save_to_disk; a datasets cache folder "
            "(dataset_info.json beside .arrow files); a hub cache folder "
            "(datasets--owner--name, or one of its snapshots); a datasets.Dataset")


def source_format(path: str) -> SourceFormat | None:
    name = path.lower()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return _SUFFIXES[suffix]
    return None


def _expand(pattern: str) -> list[str]:
    p = Path(pattern)
    if p.is_dir():
        return _folder(p)
    if p.is_file():
        if source_format(pattern) is None:
            raise ConfigError(f"{pattern}: unsupported source type; accepted: {ACCEPTED}")
        return [pattern]
    matches = sorted(m for m in glob.glob(pattern, recursive=True) if Path(m).is_file())
    if not matches:
        raise ConfigError(f"{pattern}: no such file, directory or glob match")
    return ([m for m in matches if source_format(m) and not hf.is_metadata(Path(m))]
            or _no_supported(pattern))


def _expand_url(pattern: str, options: Options) -> list[str]:
    """:func:`_expand` for a URL: the same rules, over the bucket's listing (named
    without its credentials)."""
    shown = redact_url(pattern)
    if source_format(pattern) and not any(c in pattern for c in "*?["):
        if object_exists(pattern, options):
            return [pattern]
        raise ConfigError(f"{shown}: no such file, directory or glob match")
    found = expand_url(pattern, options)
    if not found:
        raise ConfigError(f"{shown}: no such file, directory or glob match")
    supported = [f for f in found if source_format(f)]
    if len(found) == 1 and found[0] == pattern and not supported:
        raise ConfigError(f"{shown}: unsupported source type; expected one of "
                          f"{sorted(_SUFFIXES)}")
    return supported or _no_supported(shown)


def _no_supported(pattern: str) -> list[str]:
    raise ConfigError(f"{pattern}: matches files, but none of a supported type "
                      f"({sorted(_SUFFIXES)})")


def _folder(p: Path) -> list[str]:
    """A folder's sources: a Hugging Face folder's data files (:mod:`.hf`), else every
    source file in its tree (sorted), never ``datasets``' own metadata JSON."""
    laid_out = hf.folder_files(p)
    if laid_out is not None:
        return laid_out
    files = [f for f in sorted(p.rglob("*")) if f.is_file()]
    nested = [n for n in hf.nested_folders(files) if n != str(p)]
    if nested:
        raise ConfigError(f"{p}: holds Hugging Face dataset folders {nested[:5]}; pass one "
                          "of them (a build reads one dataset split)")
    found = [str(f) for f in files if source_format(str(f)) and not hf.is_metadata(f)]
    if not found:
        raise ConfigError(hf.describe_folder(p, files))
    return found


def _objects(item: object) -> list[str]:
    """The files of a source given as an object: a ``datasets.Dataset``'s Arrow files."""
    files = hf.dataset_files(item)
    if files is None:
        raise ConfigError(f"a source is a path, a glob or a datasets.Dataset, got "
                          f"{type(item).__name__}")
    hf.check_rows(item, files)
    return files


def discover(patterns: Sequence[str | os.PathLike[str] | Any] | str | Any,
             storage_options: Options = None) -> list[str]:
    """Files named by paths, directories (recursive) and globs, in the order given,
    each directory or glob sorted (a Hugging Face folder in its own order, see
    :mod:`.hf`), and the Arrow files of ``datasets.Dataset`` objects; duplicates keep
    their first place. A URL (``s3://b/raw/*.jsonl.zst``) names objects by the same rules
    (:mod:`.bucket`)."""
    if isinstance(patterns, (str, os.PathLike)) or not isinstance(patterns, Sequence):
        patterns = [patterns]
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, (str, os.PathLike)):
            name = os.fspath(pattern)
            files = _expand_url(name, storage_options) if is_url(name) else _expand(name)
        else:
            files = _objects(pattern)
        for f in files:
            key = f if is_url(f) else os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    if not out:
        raise ConfigError("no sources given")
    return out


def fingerprint(path: str, storage_options: Options = None, *, size: int | None = None
                ) -> str:
    """A content fingerprint from the size and three 1 MiB samples (head, middle, tail):
    cheap on terabytes, and it changes when a file is replaced, truncated or appended.
    An object's samples are three ranged GETs at once; its fingerprint is its local
    copy's."""
    size = object_size(path, storage_options) if size is None else size
    h = xxhash.xxh3_64()
    h.update(str(size).encode())
    offsets = sorted({0, max(0, size // 2 - _FINGERPRINT_SAMPLE // 2),
                      max(0, size - _FINGERPRINT_SAMPLE)})
    for sample in read_samples(path, [(o, o + _FINGERPRINT_SAMPLE) for o in offsets],
                               storage_options):
        h.update(sample)
    return h.hexdigest()


def describe(paths: Iterable[str], storage_options: Options = None) -> list[SourceInfo]:
    out = []
    for p in paths:
        fmt = source_format(p)
        if fmt is None:
            raise ConfigError(f"{redact_url(p)}: unsupported source type")
        size = object_size(p, storage_options)
        out.append(SourceInfo(path=p if is_url(p) else os.path.abspath(p), size=size,
                              fingerprint=fingerprint(p, storage_options, size=size),
                              format=fmt.value))
    return out


def segment_size(file_size: int, override: int | None = None) -> int:
    """Nominal segment size: the file cut into at most 256 pieces of at least 4 MiB."""
    if override is not None:
        return max(1, override)
    return max(MIN_SEGMENT_BYTES, -(-file_size // MAX_SEGMENTS_PER_FILE))


def next_line_start(f: BinaryIO, position: int, size: int, block: int = 64 << 10) -> int:
    """The first line start at or after ``position`` (a line starts at 0 or after a newline).

    Reads from ``position - 1`` to the next newline only, ``block`` bytes at a time (one
    short read for lines of ordinary length), so a range ``[a, b)`` can be aligned lazily
    by whoever reads it.
    """
    if position <= 0:
        return 0
    f.seek(position - 1)
    pos = position - 1
    while pos < size:
        data = f.read(block)
        if not data:
            break
        nl = data.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(data)
    return size


_next_line_start = next_line_start  # the former private name, kept for callers


def plan_segments(info: SourceInfo, segment_bytes: int | None = None,
                  storage_options: Options = None) -> list[Segment]:
    """The segments of one source (see the module docstring)."""
    fmt = SourceFormat(info.format)
    if fmt is SourceFormat.PARQUET:
        from shardwise.sources.bucket import parquet_input

        with parquet_input(info.path, storage_options, info.size) as pf:
            meta = pf.metadata
        segs, row = [], 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            segs.append(Segment(start=row, stop=row + n, position=row))
            row += n
        return segs or [Segment(start=0, stop=0, position=0)]
    if fmt is SourceFormat.ARROW:
        return arrow_segments(info, segment_bytes)
    if fmt is not SourceFormat.JSONL:
        return [Segment(start=0, stop=-1, position=0)]
    size = info.size
    step = segment_size(size, segment_bytes)
    bounds = [0]
    probed = line_probes(info.path, range(step, size, step), storage_options)
    with open_source(info.path, storage_options, buffer=64 << 10, size=size) as f:
        nominal = step
        while nominal < size:
            b = probed.get(nominal) or next_line_start(f, nominal, size)
            if b > bounds[-1] and b < size:
                bounds.append(b)
            nominal = max(nominal + step, b)
    bounds.append(size)
    return [Segment(start=a, stop=b, position=a) for a, b in zip(bounds, bounds[1:], strict=False)]


def arrow_segments(info: SourceInfo, segment_bytes: int | None = None) -> list[Segment]:
    """An Arrow file cut into row ranges of about :func:`segment_size` bytes each (rows
    in proportion to the file's size): a function of the file alone."""
    from shardwise.sources.arrow import arrow_rows

    rows = arrow_rows(info.path)
    pieces = max(1, -(-info.size // segment_size(info.size, segment_bytes)))
    step = max(1, -(-rows // pieces))
    bounds = [*range(0, rows, step), rows] if rows else [0, 0]
    return [Segment(start=a, stop=b, position=a) for a, b in zip(bounds, bounds[1:], strict=False)]
