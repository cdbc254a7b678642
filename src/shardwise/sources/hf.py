"""Hugging Face ``datasets`` as sources: their folders and objects, resolved to files.

Four layouts, each read through its own metadata (the ``datasets`` library is not
needed), each giving its data files in row order::

    saved/                      save_to_disk: state.json lists data-0000N-of-0000M.arrow
      state.json  dataset_info.json  data-00000-of-00002.arrow  data-00001-of-00002.arrow
    dd/                         DatasetDict.save_to_disk: one saved folder per split
      dataset_dict.json  train/  test/                                    → refused: pick one
    <cache>/parquet/default-…/0.0.0/<hash>/     what load_dataset writes (datasets cache)
      dataset_info.json  parquet-train.arrow  parquet-test-00000-of-00002.arrow …
    datasets--owner--name/      the hub cache (huggingface_hub): refs/main names the
      blobs/  refs/main  snapshots/<commit>/data/train-00000-of-00001.parquet   snapshot

A folder holding more than one split (train and test) is refused, naming each split's
files: a build never mixes evaluation rows into training ones without being told. A
``datasets.Dataset`` is read through its Arrow cache files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from shardwise.errors import ConfigError

METADATA = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json"})
"""JSON files of ``datasets``' own, never data (a pretty-printed one is not JSON lines);
``state.json`` is one only beside ``dataset_info.json`` (a save_to_disk folder)."""


def is_metadata(path: Path) -> bool:
    """A JSON file of ``datasets``' own (:data:`METADATA`, or a save_to_disk state.json)."""
    return path.name in METADATA or (path.name == "state.json"
                                      and (path.parent / "dataset_info.json").is_file())


SPLIT_WORDS = {"train": ("train", "training"),
               "validation": ("validation", "valid", "val", "dev"),
               "test": ("test", "testing", "eval", "evaluation")}
"""The words ``datasets`` takes a file's split from (its default data-file patterns)."""


def folder_files(folder: Path) -> list[str] | None:
    """The data files of a Hugging Face folder in row order, or None if it is none."""
    if (folder / "dataset_dict.json").is_file():
        raise ConfigError(_dataset_dict_message(folder))
    if (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file():
        return _saved_files(folder)
    if (folder / "dataset_info.json").is_file() and any(folder.glob("*.arrow")):
        split, files = _one_split(folder, _cache_splits(folder))
        _check_cache_rows(folder, split, files)
        return files
    snapshot = hub_snapshot(folder)
    if snapshot is not None:
        from shardwise.sources.discovery import source_format

        files = [str(f) for f in sorted(snapshot.rglob("*"))
                 if f.is_file() and not is_metadata(f) and source_format(str(f))]
        return _one_split(folder, _path_splits(snapshot, files))[1] if files else None
    return None


def _saved_files(folder: Path) -> list[str]:
    """The ``.arrow`` files ``state.json`` lists (save_to_disk's order)."""
    state_path = folder / "state.json"
    try:
        state = orjson.loads(state_path.read_bytes())
        names = [d["filename"] for d in state["_data_files"]]
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{state_path}: not a state.json written by datasets' save_to_disk "
                          f"(no _data_files list: {e}); pass the folder's .arrow files "
                          "instead") from None
    if state.get("_indices_data_files"):
        raise ConfigError(f"{folder}: saved with an indices mapping; load it, call "
                          "ds.flatten_indices() and save_to_disk it again")
    files = [str(folder / n) for n in names]
    absent = [f for f in files if not os.path.isfile(f)]
    if absent or not files:
        raise ConfigError(f"{state_path} lists {names}, but {absent or 'no file'} is not "
                          "there: the folder is incomplete; save_to_disk it again")
    return files


def _dataset_dict_message(folder: Path) -> str:
    try:
        splits = orjson.loads((folder / "dataset_dict.json").read_bytes())["splits"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return (f"{folder}: a DatasetDict saved by save_to_disk, with splits {splits}; a build "
            f"reads one split: pass {', '.join(str(folder / s) for s in splits)}")


def _cache_splits(folder: Path) -> dict[str, list[str]]:
    """A datasets cache folder's ``.arrow`` files by split: ``<name>-<split>.arrow`` or
    ``<name>-<split>-0000N-of-0000M.arrow``, the splits named in dataset_info.json
    (``cache-*.arrow``, what ``map`` or ``shuffle`` wrote beside them, is no split's)."""
    files = sorted(str(f) for f in folder.glob("*.arrow") if not f.name.startswith("cache-"))
    try:
        info = orjson.loads((folder / "dataset_info.json").read_bytes())
        splits = list(info.get("splits") or {})
    except (orjson.JSONDecodeError, AttributeError):
        splits = []
    out: dict[str, list[str]] = {}
    for split in splits:
        pattern = re.compile(rf".+-{re.escape(split)}(-\d+-of-\d+)?\.arrow$")
        out[split] = [f for f in files if pattern.match(os.path.basename(f))]
    named = {f for fs in out.values() for f in fs}
    rest = [f for f in files if f not in named]
    if rest:
        out["(no split in the name)"] = rest
    return {s: fs for s, fs in out.items() if fs}


def _path_splits(root: Path, files: list[str]) -> dict[str, list[str]]:
    """Files by the split a word of their path names (as ``datasets`` assigns them);
    files that name none are ``train``, as ``datasets`` has it."""
    out: dict[str, list[str]] = {}
    for f in files:
        words = set(re.split(r"[^a-z]+", os.path.relpath(f, root).lower()))
        split = next((s for s, ws in SPLIT_WORDS.items() if words & set(ws)), "train")
        out.setdefault(split, []).append(f)
    return out


def _one_split(folder: Path, splits: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The only split's name and files; more than one is refused, naming each."""
    if len(splits) == 1:
        return next(iter(splits.items()))
    if not splits:
        raise ConfigError(f"{folder}: dataset_info.json beside .arrow files, but none of "
                          "them is a split's (only cache-*.arrow); pass the files to build")
    listed = "; ".join(f"{s}: {', '.join(_short(fs))}" for s, fs in splits.items())
    raise ConfigError(f"{folder}: holds {len(splits)} splits ({listed}); a build reads one "
                      "split: pass its files (or a glob of them) instead of the folder")


def _check_cache_rows(folder: Path, split: str, files: list[str]) -> None:
    """The split's files hold the rows dataset_info.json counts (a shard deleted or cut
    short would lose rows without a word)."""
    from shardwise.sources.arrow import arrow_rows

    info = orjson.loads((folder / "dataset_info.json").read_bytes())
    want = ((info.get("splits") or {}).get(split) or {}).get("num_examples")
    held = sum(arrow_rows(f) for f in files)
    if want is not None and held != want:
        raise ConfigError(f"{folder}: the {split} split's files {_short(files)} hold {held} "
                          f"rows, dataset_info.json counts {want}: the cache is incomplete "
                          "or changed; load_dataset it again with "
                          "download_mode='force_redownload'")


def _short(files: list[str], keep: int = 3) -> list[str]:
    return files[:keep] + ([f"… {len(files) - keep} more"] if len(files) > keep else [])


def hub_snapshot(folder: Path) -> Path | None:
    """The snapshot of a hub cache entry: ``refs/main``'s, else the only one; a snapshot
    folder itself; None for any other folder."""
    if folder.parent.name == "snapshots" and (folder.parent.parent / "blobs").is_dir():
        return folder
    snapshots = folder / "snapshots"
    if not (snapshots.is_dir() and (folder / "blobs").is_dir()):
        return None
    main = folder / "refs" / "main"
    if main.is_file() and (snapshots / main.read_text().strip()).is_dir():
        return snapshots / main.read_text().strip()
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) == 1:
        return found[0]
    raise ConfigError(f"{folder}: a hub cache entry with {len(found)} snapshots "
                      f"{[p.name for p in found]} and no refs/main naming one; pass "
                      f"{snapshots}/<commit>")


def nested_folders(files: Iterable[Path]) -> list[str]:
    """Hugging Face folders among ``files`` of a plain folder's tree (the folders
    holding their metadata, and hub cache entries), for an error that names them."""
    out: set[str] = set()
    for f in files:
        if f.name in ("dataset_info.json", "dataset_dict.json"):
            out.add(str(f.parent))
        hub = next((p for p in f.parents if p.name.startswith("datasets--")), None)
        if hub is not None:
            out.add(str(hub))
    return sorted(out)


def dataset_files(obj: Any) -> list[str] | None:
    """The Arrow cache files of a ``datasets.Dataset``; None for anything else."""
    if not type(obj).__module__.startswith("datasets"):
        return None
    name = type(obj).__name__
    if name != "Dataset":
        hint = " (pass one split, e.g. ds['train'])" if name == "DatasetDict" else ""
        raise ConfigError(f"a Hugging Face {name} cannot be read through its Arrow files"
                          f"{hint}; pass a datasets.Dataset")
    if getattr(obj, "_indices", None) is not None:
        raise ConfigError("this Dataset has an indices mapping (from select, shuffle, filter "
                          "or train_test_split); call ds = ds.flatten_indices() first")
    files = [c["filename"] for c in getattr(obj, "cache_files", [])]
    if not files:
        raise ConfigError("this Dataset lives in memory and has no Arrow cache files; "
                          "ds.save_to_disk(path) and pass path (or ds.to_parquet(file))")
    return files


def check_rows(obj: Any, files: list[str]) -> None:
    """A Dataset partly in memory (a column added, rows concatenated) has cache files
    that do not hold all its rows: refuse, never build a part of it."""
    from shardwise.sources.arrow import arrow_rows

    held = sum(arrow_rows(f) for f in files)
    if held != obj.num_rows:
        raise ConfigError(f"this Dataset has {obj.num_rows} rows, but its Arrow cache files "
                          f"hold {held} (part of it lives in memory); "
                          "ds.save_to_disk(path) and pass path")


def describe_folder(folder: Path, files: list[Path]) -> str:
    """What a folder with no source holds, and what is accepted."""
    from shardwise.sources.discovery import ACCEPTED

    counts: dict[str, int] = {}
    for f in files:
        compressed = len(f.suffixes) > 1 and f.suffix.lower() in (".gz", ".zst", ".bz2", ".xz")
        key = ("".join(f.suffixes[-2:]) if compressed else f.suffix).lower() or "(no suffix)"
        key = f"{key} ({f.name}, datasets' metadata)" if f.name in METADATA else key
        counts[key] = counts.get(key, 0) + 1
    held = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing"
    return f"{folder}: holds {held} files and no source shardwise reads; accepted: {ACCEPTED}"
