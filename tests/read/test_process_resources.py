"""A reader's process-local resources (clients, thread pools, downloads, maps) are made in
each process on first use: a pickled reader carries none, and a forked child uses none of
its parent's — it makes its own and reads the same batches (concurrency/local.py)."""

from __future__ import annotations

import functools
import multiprocessing as mp
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import shardwise as sw
from shardwise.concurrency.local import ProcessLocal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from cachefactory import make_cache, sample_docs  # noqa: E402

INDICES = list(range(0, 40, 3))


def process_locals(root: object) -> list[ProcessLocal[Any]]:
    """Every ProcessLocal reachable from ``root`` through shardwise objects (their
    attributes, containers, partials and bound methods)."""
    found: list[ProcessLocal[Any]] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (np.ndarray, str, bytes, int, float, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, ProcessLocal):
            found.append(obj)
            todo.append(obj.make)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, functools.partial):
            todo.extend([obj.func, *obj.args, *obj.keywords.values()])
        elif isinstance(obj, types.MethodType):
            todo.append(obj.__self__)
        elif type(obj).__module__.startswith("shardwise") and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    return found


@pytest.fixture(scope="module")
def remote_reader(tmp_path_factory: pytest.TempPathFactory) -> sw.TokenDataset:
    """A TokenDataset over a cache on an object store (fsspec's memory store), after a
    batch: its client, downloads and thread pools are made."""
    tmp = tmp_path_factory.mktemp("resources")
    local = make_cache(tmp / "cache", [sample_docs(60, seed=1), sample_docs(40, seed=2)],
                       chunk_docs=7)
    fs = fsspec.filesystem("memory")
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.pipe(f"memory://process-local/cache/{p.relative_to(local)}", p.read_bytes())
    cache = sw.open_cache("memory://process-local/cache", local_dir=tmp / "node")
    ds = sw.TokenDataset(cache, seq_len=16, seed=3)
    ds.__getitems__(INDICES)
    return ds


def test_a_pickled_reader_carries_no_process_resource(remote_reader: sw.TokenDataset) -> None:
    made = [p for p in process_locals(remote_reader) if p.made is not None]
    assert len(made) >= 3, made  # the client, the downloads, the store's threads at least
    copy = pickle.loads(pickle.dumps(remote_reader))
    found = process_locals(copy)
    assert len(found) >= len(made) and all(p.made is None for p in found), found
    want = remote_reader.__getitems__(INDICES).batch
    got = copy.__getitems__(INDICES).batch
    assert all(np.array_equal(got[k], want[k]) for k in want)


def _in_child(ds: sw.TokenDataset, out: Any) -> None:
    before = {id(p): p._held for p in process_locals(ds)}  # noqa: SLF001 - the parent's values
    inherited = [p for p in process_locals(ds) if p.made is not None]
    got = ds.__getitems__(INDICES).batch  # the chunks are on the node: maps only
    store = ds.cache.store
    assert store.remote.get("manifest.json") and store.submit(lambda: 1).result() == 1
    mine = [p for p in process_locals(ds) if p.made is not None]
    reused = [p for p in mine if before.get(id(p)) is not None
              and before[id(p)][1] is p.made]  # type: ignore[index]
    out.put((len(inherited), len(mine), len(reused), {k: v.tolist() for k, v in got.items()}))


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12
def test_a_forked_child_uses_none_of_its_parents_resources(
        remote_reader: sw.TokenDataset) -> None:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(remote_reader, out))
    child.start()
    inherited, mine, reused, got = out.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0
    assert (inherited, reused) == (0, 0) and mine >= 2  # made its own, none of the parent's
    want = remote_reader.__getitems__(INDICES).batch
    assert {k: v.tolist() for k, v in want.items()} == got
