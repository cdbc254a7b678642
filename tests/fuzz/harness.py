"""What every fuzz case runs: copy a clean cache, damage one file, read it with every
reader and ``verify``, and hold the outcome to the property of issue 27 — the clean data
exactly, or a shardwise error naming the cache — never a raw exception, a hang, another
number of examples, or a write outside the cache."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import shardwise as sw
from shardwise.errors import CacheError, ShardwiseError
from shardwise.storage.summary import summarize
from shardwise.storage.verify import verify_cache

CASE_SECONDS = 60.0  # a loaded 2-core machine; a clean case takes well under a second
SEQ_LEN = 16
Outcome = list[bytes] | ShardwiseError


def within(seconds: float, job: Callable[[], Any]) -> Any:
    """``job()`` on a thread; an AssertionError if it has not ended after ``seconds`` (a
    hang), its exception re-raised if it raised."""
    result: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(job())
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            failed.append(e)

    t = threading.Thread(target=run, daemon=True, name="fuzz-case")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"the case did not end within {seconds} s (a hang)")
    if failed:
        raise failed[0]
    return result[0]


def outcome(read: Callable[[], list[bytes]]) -> Outcome:
    """What a reader did: its examples, or the shardwise error it raised (anything else
    is raised: a crash is a failure)."""
    try:
        return read()
    except ShardwiseError as e:
        return e


def token_examples(root: str | Path, shuffle: str = "document", **open_kw: Any
                   ) -> list[bytes]:
    """A TokenDataset's every example (document shuffle: plan files are read), then the
    background verification's findings."""
    cache = sw.open_cache(root, **open_kw)
    try:
        ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=1, shuffle=shuffle)
        out = [np.asarray(ds[i]["input_ids"]).tobytes() for i in range(len(ds))]
        cache.wait_for_verify()
        cache.raise_if_damaged()
        return out
    finally:
        cache.close()


def loader_examples(root: str | Path, **open_kw: Any) -> list[bytes]:
    """The torch loader's micro-batches over the same dataset, rank 0 of 1."""
    from shardwise.torch import loader

    cache = sw.open_cache(root, **open_kw)
    try:
        ds = sw.TokenDataset(cache, seq_len=SEQ_LEN, seed=1, shuffle="document")
        dl = loader(ds, global_batch_size=4, micro_batch_size=2, world=sw.World(0, 1),
                    epochs=1)
        out = [np.asarray(b["input_ids"]).tobytes() for b in itertools.islice(dl, 10_000)]
        cache.wait_for_verify()
        cache.raise_if_damaged()
        return out
    finally:
        cache.close()


def stream_examples(root: str | Path, **open_kw: Any) -> list[bytes]:
    """A StreamDataset's one epoch (stream placement: chunks read whole and hashed)."""
    cache = sw.open_cache(root, **open_kw)
    try:
        st = sw.StreamDataset(cache, seq_len=SEQ_LEN, seed=1, streams=2, epochs=1,
                              world=sw.World(0, 1))
        return [np.asarray(x["input_ids"]).tobytes() for x in itertools.islice(st, 10_000)]
    finally:
        cache.close()


def summary(root: str | Path, **open_kw: Any) -> list[bytes]:
    """What ``inspect`` prints of a cache, as one 'example' (its totals)."""
    cache = sw.open_cache(root, **open_kw)
    try:
        s = summarize(cache)
        return [repr((s.chunks, s.documents, s.tokens)).encode()]
    finally:
        cache.close()


def window_examples(root: str | Path, **open_kw: Any) -> list[bytes]:
    """The default order (windows of the stored token stream: no document plan)."""
    return token_examples(root, shuffle="window", **open_kw)


READERS: dict[str, Callable[..., list[bytes]]] = {
    "TokenDataset": token_examples, "TokenDataset/window": window_examples,
    "loader": loader_examples,
    "StreamDataset": stream_examples, "inspect": summary}


@dataclass
class Clean:
    """A clean cache and what each reader reads of it."""

    root: Path
    reads: dict[str, list[bytes]] = field(default_factory=dict)
    also: list[dict[str, list[bytes]]] = field(default_factory=list)
    """Other reads as good as clean: a journal record removed leaves the cache as it was
    before the record (a build mid-way), which no reader can tell from damage."""

    @classmethod
    def of(cls, root: Path) -> Clean:
        return cls(root, {name: read(root) for name, read in READERS.items()})

    @staticmethod
    def reads_of(root: Path) -> dict[str, list[bytes]]:
        """What each reader that accepts ``root`` reads of it."""
        got = {name: outcome(lambda read=read: read(root))  # type: ignore[misc]
               for name, read in READERS.items()}
        return {k: v for k, v in got.items() if not isinstance(v, ShardwiseError)}


@dataclass
class Case:
    """A copy of a clean cache in a directory of its own, beside a sibling directory whose
    bytes are compared after the case (a write outside the cache)."""

    dir: Path
    cache: Path

    @classmethod
    def of(cls, clean: Path) -> Case:
        d = Path(tempfile.mkdtemp(prefix="shardwise-fuzz-"))
        (d / "sibling").mkdir()
        (d / "sibling" / "keep.txt").write_text("untouched\n")
        return cls(d, Path(shutil.copytree(clean, d / "cache", symlinks=True)))

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def assert_nothing_written_outside(self) -> None:
        assert sorted(os.listdir(self.dir)) == ["cache", "sibling"], os.listdir(self.dir)
        assert os.listdir(self.dir / "sibling") == ["keep.txt"]
        assert (self.dir / "sibling" / "keep.txt").read_text() == "untouched\n"


REPORTS = {"inspect"}
"""Readers that report what the ledger says without opening every chunk (``inspect``'s
totals): their output may differ from the clean cache's only where ``verify`` finds the
damage (:func:`check_verify`)."""


def check_reads(clean: Clean, root: str | Path, where: str, what: str,
                readers: dict[str, Callable[..., list[bytes]]] = READERS,
                **open_kw: Any) -> dict[str, Outcome]:
    """Every reader over ``root``: the clean data exactly, or a shardwise error whose
    message names the cache ``where`` (its path or URL)."""
    got: dict[str, Outcome] = {}
    for name, read in readers.items():
        out = outcome(lambda read=read: read(root, **open_kw))  # type: ignore[misc]
        if isinstance(out, ShardwiseError):
            assert where in str(out), f"{what}: {name} raised without naming the cache: {out!r}"
        elif any(out == also.get(name) for also in clean.also):
            pass
        elif name in REPORTS and out != clean.reads[name]:
            got[f"{name} differs"] = out
        else:
            assert len(out) == len(clean.reads[name]), (
                f"{what}: {name} read {len(out)} examples, the clean cache has "
                f"{len(clean.reads[name])}")
            assert out == clean.reads[name], f"{what}: {name} read other examples"
        got[name] = out
    return got


def check_verify(root: str | Path, what: str, reads: dict[str, Outcome]) -> None:
    """``verify`` never raises; when it says OK, every reader read the clean data (a
    reader that refused a cache verify passes would be a reader stricter than verify: a
    file verify does not check, the plan files, may do that)."""
    report = verify_cache(root)
    if report.ok:
        refused = {k: v for k, v in reads.items() if isinstance(v, CacheError)
                   and ".shardwise-plans" not in str(v)}  # damage, not a usage refusal
        assert not refused, f"{what}: verify says OK, yet readers refused: {refused}"
        differ = [k for k in reads if k.endswith(" differs")]
        assert not differ, f"{what}: verify says OK, yet {differ} from the clean cache"
