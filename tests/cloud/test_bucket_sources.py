"""Sources in a bucket (issue 23 item 1), against a real S3 server (SeaweedFS): globs and
directories as locally, JSONL segments by ranged reads, compressed files streamed, Parquet
row groups read remotely; the chunks equal a build from local copies; a killed build
resumes; fingerprints read samples, not whole objects; trace names the objects' lines;
and every request goes through the one client (item 3)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.cloud.compare import assert_same_files, bucket_files, relocated
from tests.cloud.conftest import (
    BUCKET,
    build_local_copies,
    ledger_chunks,
    raw_in_bucket,
    s3fs_client,
)
from tests.helpers_cache import cache_files

import shardwise as sw
from shardwise.errors import ConfigError, InputError
from shardwise.read.config import ReadConfig
from shardwise.read.trace import trace
from shardwise.remote.client import RemoteStore
from shardwise.sources.bucket import open_source
from shardwise.sources.discovery import describe, discover, fingerprint

RAW = f"s3://{BUCKET}/raw"
PATTERNS = ["*.jsonl", "*.jsonl.zst", "*.jsonl.gz", "*.parquet"]
OPTS: dict[str, Any] = dict(chunk_docs=32, segment_bytes=64_000, append_eod=True,
                            progress=False, workers=2)


@pytest.fixture(scope="module")
def raw(s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The local copies; the same files are under ``RAW``."""
    return raw_in_bucket(tmp_path_factory.mktemp("raw") / "raw", RAW)


@pytest.fixture(scope="module")
def local_build(raw: dict[str, Path], tokenizer_path: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the local copies, built by the same globs into a local directory."""
    return build_local_copies(raw, PATTERNS, tmp_path_factory.mktemp("ref") / "cache",
                              tokenizer=tokenizer_path, **OPTS)


def _paths(raw: dict[str, Path]) -> dict[str, str]:
    return {str(p): f"{RAW}/{name}" for name, p in raw.items()}


def test_globs_in_a_bucket_build_the_chunks_of_the_local_copies(
        raw: dict[str, Path], local_build: Path, tokenizer_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Also item 3: the fault policy lives in RemoteStore's methods, so no code of a build
    (sources, chunk publication, the ledger, a rerun's check and repair) may reach the
    filesystem object itself (the forked workers inherit the guard)."""
    real = RemoteStore.fs

    def only_from_the_client(self: RemoteStore) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        assert caller.endswith(str(Path("remote", "client.py"))), (
            f"{caller} reaches the store around RemoteStore")
        return real.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(RemoteStore, "fs", property(only_from_the_client))
    out = f"s3://{BUCKET}/cache-globs"
    sources = [f"{RAW}/{p}" for p in PATTERNS]
    summary = sw.build(sources, out, tokenizer=tokenizer_path, **OPTS)
    assert summary.sources == 4 and summary.chunks > 20
    want = relocated(local_build, _paths(raw))
    assert_same_files(bucket_files(out), want)
    manifest = orjson.loads(bucket_files(out)["manifest.json"])
    assert [s["path"] for s in manifest["sources"]] == [
        f"{RAW}/{n}" for n in ("a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "d.parquet")]
    ledger = orjson.loads(bucket_files(out)["ledger.json"])
    assert len(ledger["sources"][0]["segments"]) > 5  # ranged segments of one object
    assert len(ledger["sources"][3]["segments"]) == 3  # one per row group
    s3fs_client().rm_file(f"{out.removeprefix('s3://')}/chunks/00000/00000-00001.bin")
    again = sw.build(sources, out, tokenizer=tokenizer_path, **OPTS)
    assert list(again.rebuilt_chunks) == ["chunks/00000/00000-00001"]
    assert_same_files(bucket_files(out), want)


def test_the_cli_builds_bucket_to_bucket(raw: dict[str, Path], tokenizer_path: Path,
                                         cli: Any) -> None:
    out = f"s3://{BUCKET}/cache-cli"
    code, stdout, _ = cli("build", f"{RAW}/*.jsonl.zst", f"{RAW}/*.parquet", "--out", out,
                          "--tokenizer", tokenizer_path, "--no-progress", "--json")
    assert code == 0 and orjson.loads(stdout)["sources"] == 2
    manifest = orjson.loads(bucket_files(out)["manifest.json"])
    assert [s["path"] for s in manifest["sources"]] == [f"{RAW}/b.jsonl.zst",
                                                         f"{RAW}/d.parquet"]


def test_any_fsspec_scheme_goes_through_the_same_code(
        raw: dict[str, Path], local_build: Path, tokenizer_path: Path, tmp_path: Path) -> None:
    """gs:// and az:// need their client packages (and a server); fsspec's in-memory
    store stands in for them: nothing S3-specific is on the path."""
    import fsspec

    mem = fsspec.filesystem("memory")
    for name, p in raw.items():
        mem.pipe_file(f"/h23/raw/{name}", p.read_bytes())
    try:
        sw.build([f"memory://h23/raw/{p}" for p in PATTERNS], tmp_path / "c",
                 tokenizer=tokenizer_path, **dict(OPTS, workers=1))
    finally:
        mem.rm("/h23", recursive=True)
    paths = {str(p): f"memory://h23/raw/{name}" for name, p in raw.items()}
    assert_same_files(cache_files(tmp_path / "c"), relocated(local_build, paths))


def test_a_bucket_directory_into_a_local_cache(raw: dict[str, Path], tokenizer_path: Path,
                                              tmp_path: Path) -> None:
    d = raw["a.jsonl"].parent
    sw.build([str(d)], tmp_path / "local", tokenizer=tokenizer_path, **OPTS)
    sw.build([RAW + "/"], tmp_path / "remote", tokenizer=tokenizer_path, **OPTS)
    assert_same_files(cache_files(tmp_path / "remote"),
                      relocated(tmp_path / "local", _paths(raw)))
    again = sw.build([RAW], tmp_path / "remote", tokenizer=tokenizer_path, **OPTS)
    assert again.new_chunks == 0 and again.resumed_chunks == again.chunks


def test_a_killed_bucket_build_resumes_to_the_same_bytes(
        raw: dict[str, Path], local_build: Path, tokenizer_path: Path) -> None:
    out = f"s3://{BUCKET}/cache-killed"
    sources = [f"{RAW}/{p}" for p in PATTERNS]
    opts = dict(OPTS, workers=1)
    code = ("import shardwise as sw; "
            f"sw.build({sources!r}, {out!r}, tokenizer={str(tokenizer_path)!r}, **{opts!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while ledger_chunks(out) < 6 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    published = ledger_chunks(out)
    want = relocated(local_build, _paths(raw))
    total = len([k for k in want if k.endswith(".bin")])
    assert 6 <= published < total, "the kill did not land mid-build"
    summary = sw.build(sources, out, tokenizer=tokenizer_path, **OPTS)
    assert summary.resumed_chunks >= published and summary.chunks == total
    assert_same_files(bucket_files(out), want)


def test_fingerprints_read_samples_not_whole_objects(
        s3: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    line = json.dumps({"text": "x" * 1000}) + "\n"
    big = (line * (12_000_000 // len(line))).encode()
    s3fs_client().pipe_file(f"{BUCKET}/big/big.jsonl", big)
    got: list[int] = []
    ranges, read_range = RemoteStore.get_ranges, RemoteStore.read_range

    def counted_ranges(self: RemoteStore, want: list[tuple[str, int, int]]) -> list[Any]:
        out = ranges(self, want)
        got.extend(len(b) for b in out if isinstance(b, bytes))
        return out

    def counted_range(self: RemoteStore, key: str, start: int, stop: int) -> bytes:
        got.append(len(out := read_range(self, key, start, stop)))
        return out

    monkeypatch.setattr(RemoteStore, "get_ranges", counted_ranges)
    monkeypatch.setattr(RemoteStore, "read_range", counted_range)
    monkeypatch.setattr(RemoteStore, "get", lambda *a: pytest.fail("a whole-object GET"))
    (info,) = describe(discover([f"s3://{BUCKET}/big/"]))
    assert info.size == len(big) and info.path == f"s3://{BUCKET}/big/big.jsonl"
    assert 0 < sum(got) <= 3 << 20  # three 1 MiB samples
    (tmp_path / "big.jsonl").write_bytes(big)  # the same bytes, locally
    assert fingerprint(str(tmp_path / "big.jsonl")) == info.fingerprint


def test_a_front_to_back_reader_gets_each_block_once_read_ahead(
        s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * (10 << 12)  # 10 MiB
    s3fs_client().pipe_file(f"{BUCKET}/ahead/x.bin", data)
    url, mib = f"s3://{BUCKET}/ahead/x.bin", 1 << 20
    calls: list[tuple[int, int]] = []
    real = RemoteStore.read_range

    def counted(self: RemoteStore, key: str, start: int, stop: int) -> bytes:
        calls.append((start, stop))
        return real(self, key, start, stop)

    monkeypatch.setattr(RemoteStore, "read_range", counted)
    with open_source(url, buffer=mib, ahead_until=len(data)) as f:
        assert b"".join(iter(lambda: f.read(mib), b"")) == data
    assert sorted(calls) == [(i * mib, (i + 1) * mib) for i in range(10)]
    with open_source(url, buffer=mib, ahead_until=3 * mib) as f:
        assert f.read(mib) == data[:mib]
        f.seek(5 * mib)  # the block read ahead is dropped
        assert f.read(100) == data[5 * mib: 5 * mib + 100]
        f.seek(mib // 2)
        assert f.read(3 * mib) == data[mib // 2: 3 * mib + mib // 2]


def test_trace_names_objects_and_lines(raw: dict[str, Path], local_build: Path,
                                       tokenizer_path: Path, tmp_path: Path, cli: Any) -> None:
    sw.build([f"{RAW}/{p}" for p in PATTERNS], tmp_path / "cache", tokenizer=tokenizer_path,
             **OPTS)
    layout = {"seq_len": 24, "seed": 3, "global_batch_size": 8, "micro_batch_size": 2,
              "world_size": 2}
    here = trace(ReadConfig.from_dict({"cache": str(local_build), **layout}), 2).to_dict()
    there = trace(ReadConfig.from_dict({"cache": str(tmp_path / "cache"), **layout}),
                  2).to_dict()
    text = orjson.dumps(here).decode()
    for p, url in _paths(raw).items():
        text = text.replace(f'"{p}"', f'"{url}"')
    assert orjson.loads(text)["examples"] == orjson.loads(orjson.dumps(there))["examples"]
    (tmp_path / "read.json").write_text(json.dumps({"cache": "cache", **layout}))
    code, out, _ = cli("trace", tmp_path / "read.json", "--step", 2)
    assert code == 0 and f"{RAW}/a.jsonl:" in out


def test_bad_input_in_a_bucket_is_named_by_url_and_line(
        s3: dict[str, str], tokenizer_path: Path, tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"line {i} " * 50}) for i in range(400)]
    lines[300] = "{not json"
    s3fs_client().pipe_file(f"{BUCKET}/bad/x.jsonl", ("\n".join(lines) + "\n").encode())
    with pytest.raises(InputError, match=rf"s3://{BUCKET}/bad/x\.jsonl:301"):
        sw.build([f"s3://{BUCKET}/bad/x.jsonl"], tmp_path / "c", tokenizer=tokenizer_path,
                 segment_bytes=20_000, progress=False, workers=1)
    with pytest.raises(ConfigError, match="no such file, directory or glob match"):
        sw.build([f"s3://{BUCKET}/raw/nothing*.jsonl"], tmp_path / "d",
                 tokenizer=tokenizer_path, progress=False)
