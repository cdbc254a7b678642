"""Stream placement with real processes: ranks as processes give the global order; readers
following a real build get exactly the finished cache's examples and open only their own
chunks; a dead producer fails the readers within the timeout; a killed reader restarted
from its saved state continues exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tests.cachefactory import make_cache, sample_docs

import shardwise as sw
from shardwise.read.stream.dataset import StreamDataset

REPO = Path(__file__).resolve().parents[2]
BUILD = dict(workers=1, chunk_docs=8, segment_bytes=100_000, progress=False)
OPTS = dict(seq_len=64, streams=4, seed=3, block_chunks=4, epochs=1)

# A reader process. argv[1] is a JSON job: cache, rank, size, opts, out, and optionally
# n (examples to take), checkpoint (write rows + state after every example), resume.
READER = r"""
import json, os, sys, time
import numpy as np
import shardwise as sw
from shardwise.errors import ProducerTimeoutError
from shardwise.read.stream.dataset import StreamDataset

job = json.loads(sys.argv[1])
out = job["out"]
open(out + ".ready", "w").close()  # imports done: the test may start the build now
ds = StreamDataset(job["cache"], world=sw.World(job["rank"], job["size"]), **job["opts"])
info = {"finished_at_start": ds.cache.finished, "chunks_at_start": len(ds.cache.chunks)}
rows = []
try:
    if job.get("checkpoint"):
        if os.path.exists(out + ".state"):
            with open(out + ".state") as f:
                state = json.load(f)
            ds.load_state_dict(state)
            with open(out + ".rows", "r+b") as f:
                f.truncate(state["consumed"] // job["size"] * job["opts"]["seq_len"] * 8)
        with open(out + ".rows", "ab") as f:
            for e in ds:
                f.write(e["input_ids"].tobytes())
                f.flush()
                with open(out + ".tmp", "w") as g:
                    json.dump(ds.state_dict(), g)
                os.replace(out + ".tmp", out + ".state")
    else:
        for i, e in enumerate(ds):
            if i == job.get("n", -1):
                break
            rows.append(e["input_ids"])
except ProducerTimeoutError as e:
    info["error"] = str(e)
    info["raised_at"] = time.time()
info.update(opened=sorted(ds.cache.opened), stems=[c.stem for c in ds.cache.chunks],
            stats=ds.stats())
if rows:
    np.save(out + ".npy", np.stack(rows))
with open(out + ".json", "w") as f:
    json.dump(info, f)
ds.close()
sys.exit(3 if "error" in info else 0)
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, sample_corpus: Path) -> Path:
    """The sample three times over (~1.1 MB, ~190 chunks of 8 documents): the build takes
    a few seconds, publishing chunks all along."""
    texts = [orjson.loads(line)["text"] for line in sample_corpus.read_bytes().splitlines()]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"text": f"[copy {k}] {t}"}) + b"\n"
                              for k in range(3) for t in texts))
    return path


def start_reader(cache: Path, rank: int, size: int, out: Path, **job: Any
                 ) -> subprocess.Popen[bytes]:
    spec = dict(cache=str(cache), rank=rank, size=size, out=str(out), **job)
    spec.setdefault("opts", OPTS)
    return subprocess.Popen([sys.executable, "-c", READER, json.dumps(spec)], cwd=REPO)


def wait_ready(outs: list[Path], timeout: float = 60) -> None:
    """Wait until every reader process has started (so it is there before the build)."""
    deadline = time.monotonic() + timeout
    while not all(Path(f"{o}.ready").exists() for o in outs):
        assert time.monotonic() < deadline, "the reader processes did not start"
        time.sleep(0.01)


def start_build(src: Path, out: Path, tok: Path) -> subprocess.Popen[bytes]:
    code = ("from shardwise.writer.api import build; "
            f"build([{str(src)!r}], {str(out)!r}, tokenizer={str(tok)!r}, **{BUILD!r})")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO)


def published(cache: Path) -> int:
    """Chunks the ledger names now (its snapshot and the journal's records)."""
    from tests.helpers_cache import published_chunks

    return published_chunks(cache)


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> list[int]:
    return [p.wait(timeout=timeout) for p in procs]


def reference(cache: Path, rank: int, size: int, **opts: Any) -> np.ndarray:
    ds = StreamDataset(cache, world=sw.World(rank, size), **{**OPTS, **opts})
    return np.stack([e["input_ids"] for e in ds])


def load(out: Path) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(out.with_suffix(".json").read_text())
    return info


def own_chunks_only(info: dict[str, Any], rank: int, size: int) -> bool:
    index = {stem: i for i, stem in enumerate(info["stems"])}
    return bool(info["opened"]) and all(index[s] % OPTS["streams"] % size == rank  # type: ignore[operator]
                                        for s in info["opened"])


def test_rank_processes_give_the_global_order(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "c", [sample_docs(80, seed=1), sample_docs(60, seed=2)],
                       chunk_docs=3)
    opts = dict(seq_len=16, streams=4, seed=5, block_chunks=3)
    n = 240
    ds = StreamDataset(cache, world=sw.World(0, 1), **opts)  # type: ignore[arg-type]
    ref = np.stack([e["input_ids"] for e in islice(ds, n)])
    procs = {(r, R): start_reader(cache, r, R, tmp_path / f"r{r}of{R}", opts=opts, n=n // R)
             for R in (2, 4) for r in range(R)}
    assert wait_all(list(procs.values())) == [0] * len(procs)
    for R in (2, 4):
        per_rank = [np.load(tmp_path / f"r{r}of{R}.npy") for r in range(R)]
        inter = np.stack([per_rank[i % R][i // R] for i in range(n)])
        assert np.array_equal(inter, ref), f"world size {R} diverges"
        for r in range(R):
            assert own_chunks_only(load(tmp_path / f"r{r}of{R}"), r, R)


def test_followers_of_a_real_build_get_the_finished_order(tmp_path: Path, corpus: Path,
                                                          tokenizer_path: Path) -> None:
    cache = tmp_path / "cache"
    follow = dict(OPTS, follow=True, poll_interval=0.05, timeout=60)
    readers = [start_reader(cache, r, 2, tmp_path / f"f{r}", opts=follow) for r in range(2)]
    wait_ready([tmp_path / f"f{r}" for r in range(2)])
    build = start_build(corpus, cache, tokenizer_path)
    assert wait_all([build, *readers]) == [0, 0, 0]
    for r in range(2):
        info = load(tmp_path / f"f{r}")
        assert not info["finished_at_start"], "the reader started after the build ended"
        assert info["stats"]["producer_wait_s"] > 0
        got = np.load(tmp_path / f"f{r}.npy")
        assert np.array_equal(got, reference(cache, r, 2)), f"rank {r} differs"
        assert own_chunks_only(info, r, 2)


def test_a_dead_producer_fails_the_followers_within_the_timeout(
        tmp_path: Path, corpus: Path, tokenizer_path: Path) -> None:
    cache = tmp_path / "cache"
    build = start_build(corpus, cache, tokenizer_path)
    deadline = time.monotonic() + 60
    while published(cache) < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    build.send_signal(signal.SIGSTOP)  # mid-way, for sure: it cannot finish from here
    follow = dict(OPTS, follow=True, poll_interval=0.05, timeout=1.5)
    readers = [start_reader(cache, r, 2, tmp_path / f"d{r}", opts=follow) for r in range(2)]
    wait_ready([tmp_path / f"d{r}" for r in range(2)])
    build.send_signal(signal.SIGKILL)
    build.wait()
    killed_at = time.time()
    assert wait_all(readers, timeout=30) == [3, 3]
    for r in range(2):
        info = load(tmp_path / f"d{r}")
        assert "nothing new was published" in info["error"] and str(cache) in info["error"]
        assert info["raised_at"] - killed_at < 1.5 + 3.0, "raised soon after the timeout"
        assert own_chunks_only(info, r, 2)
    assert not sw.open_cache(cache).finished


def test_a_killed_reader_resumes_from_its_state(tmp_path: Path, corpus: Path,
                                                tokenizer_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "k0"
    follow = dict(OPTS, follow=True, poll_interval=0.05, timeout=60)
    reader = start_reader(cache, 0, 2, out, opts=follow, checkpoint=True)
    wait_ready([out])
    build = start_build(corpus, cache, tokenizer_path)
    state = Path(str(out) + ".state")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state.exists() and json.loads(state.read_text() or "{}").get("consumed", 0) > 300:
            break
        time.sleep(0.01)
    reader.send_signal(signal.SIGKILL)
    reader.wait()
    saved = json.loads(state.read_text())["consumed"]
    again = start_reader(cache, 0, 2, out, opts=follow, checkpoint=True)
    assert wait_all([build, again]) == [0, 0]
    got = np.fromfile(str(out) + ".rows", dtype=np.int64).reshape(-1, OPTS["seq_len"])
    want = reference(cache, 0, 2)
    assert saved > 300 and len(got) == len(want)
    assert np.array_equal(got, want)
    info = load(out)
    assert own_chunks_only(info, 0, 2)
    own = sum(1 for i in range(len(info["stems"])) if i % OPTS["streams"] % 2 == 0)  # type: ignore[operator]
    assert len(info["opened"]) < own, "the restarted reader re-read consumed chunks"
    assert os.path.getsize(str(out) + ".rows") == want.nbytes
