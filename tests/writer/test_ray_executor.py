"""The Ray executor, on a real local Ray cluster (2 CPUs) this module starts and stops:
byte-identical caches, a killed worker retried, a killed driver resumed, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.conftest import write_jsonl
from tests.helpers_cache import assert_same_cache, published_chunks

from shardwise.cli.main import main
from shardwise.errors import ConfigError, InputError, MissingExtraError
from shardwise.storage.verify import verify_cache
from shardwise.writer.api import build
from shardwise.writer.progress import BuildSummary
from shardwise.writer.ray_executor import RayExecutor

ray = pytest.importorskip("ray")

SPLIT = dict(chunk_docs=16, segment_bytes=250_000, progress=False)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # never another test's
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def split_reference(tmp_path_factory: pytest.TempPathFactory, big_corpus: Path,
                    tokenizer_path: Path) -> tuple[Path, BuildSummary]:
    """The big corpus cut into ~17 segments, built by the local executor."""
    out = tmp_path_factory.mktemp("ref") / "cache"
    return out, build([big_corpus], out, tokenizer=tokenizer_path, workers=2, **SPLIT)


def _same_summary(a: BuildSummary, b: BuildSummary) -> None:
    """Equal but for time: replayed progress and chunks of a retried task count once."""
    keys = ("sources", "chunks", "documents", "tokens", "bytes_read", "errors", "new_chunks",
            "resumed_chunks")
    assert {k: getattr(a, k) for k in keys} == {k: getattr(b, k) for k in keys}


def test_sample_corpus_equals_the_local_build(tmp_path: Path, ray_address: str,
                                              sample_corpus: Path, tokenizer_path: Path
                                              ) -> None:
    args: dict[str, Any] = dict(tokenizer=tokenizer_path, chunk_docs=100, workers=2,
                                progress=False)
    local = build([sample_corpus], tmp_path / "local", **args)
    on_ray = build([sample_corpus], tmp_path / "ray", executor="ray", **args)
    assert_same_cache(tmp_path / "local", tmp_path / "ray")
    _same_summary(local, on_ray)
    (tmp_path / "ray/chunks/00000/00000-00003.idx").unlink()  # a rerun on Ray repairs it
    again = build([sample_corpus], tmp_path / "ray", executor="ray", **args)
    assert list(again.rebuilt_chunks) == ["chunks/00000/00000-00003"]
    assert_same_cache(tmp_path / "local", tmp_path / "ray")


def test_split_corpus_equals_the_local_build(tmp_path: Path, ray_address: str,
                                             big_corpus: Path, tokenizer_path: Path,
                                             split_reference: tuple[Path, BuildSummary]
                                             ) -> None:
    with RayExecutor(2) as ex:
        on_ray = build([big_corpus], tmp_path / "ray", tokenizer=tokenizer_path, executor=ex,
                       **SPLIT)
    assert ex.task_cpu_seconds > 0 and ray.is_initialized()  # it joined, did not shut down
    assert_same_cache(split_reference[0], tmp_path / "ray")
    _same_summary(split_reference[1], on_ray)
    ledger = orjson.loads((tmp_path / "ray" / "ledger.json").read_bytes())
    assert len(ledger["sources"][0]["segments"]) > 10  # really split into many tasks


VICTIM = 4100  # a record of segment 1, in its second batch: chunks were published before


def _dies_once(marker: str) -> Callable[[dict[str, Any]], list[int]]:
    """A processor whose worker process exits hard at VICTIM unless ``marker`` exists."""

    def char_ids(record: dict[str, Any]) -> list[int]:
        if record["id"] == VICTIM and not os.path.exists(marker):
            open(marker, "x").close()
            os._exit(1)
        return [ord(ch) % 50_000 for ch in record["text"]]

    return char_ids


def test_a_killed_worker_is_retried_and_the_bytes_are_unchanged(
        tmp_path: Path, ray_address: str, big_corpus: Path) -> None:
    marker = tmp_path / "died"
    args = dict(vocab_size=50_000, chunk_docs=64, segment_bytes=2_000_000, workers=2,
                progress=False)
    marker.touch()  # the reference never dies
    local = build([big_corpus], tmp_path / "local", processor=_dies_once(str(marker)), **args)
    marker.unlink()
    on_ray = build([big_corpus], tmp_path / "ray", processor=_dies_once(str(marker)),
                   executor="ray", **args)
    assert marker.exists(), "the worker was not killed"
    assert_same_cache(tmp_path / "local", tmp_path / "ray")
    _same_summary(local, on_ray)
    ledger = orjson.loads((tmp_path / "ray" / "ledger.json").read_bytes())
    segments = ledger["sources"][0]["segments"]
    assert len(segments) == 2 and len(segments[1]["chunks"]) > 1024 // 64



def test_a_killed_driver_resumes_to_identical_bytes(
        tmp_path: Path, ray_address: str, big_corpus: Path, tokenizer_path: Path,
        split_reference: tuple[Path, BuildSummary]) -> None:
    ref_root, reference = split_reference
    out = tmp_path / "cache"
    code = ("from shardwise.writer.api import build; "
            f"build([{str(big_corpus)!r}], {str(out)!r}, tokenizer={str(tokenizer_path)!r}, "
            f"workers=2, executor='ray', address={ray_address!r}, **{SPLIT!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while published_chunks(out) < 20 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    published = published_chunks(out)
    assert 20 <= published < reference.chunks, "the kill did not land mid-build"
    summary = build([big_corpus], out, tokenizer=tokenizer_path, workers=2, **SPLIT)
    assert summary.resumed_chunks >= published and summary.chunks == reference.chunks
    assert_same_cache(ref_root, out)
    assert verify_cache(out).ok


def test_cli_executor_ray(tmp_path: Path, ray_address: str, sample_corpus: Path,
                          tokenizer_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [str(sample_corpus), "--tokenizer", str(tokenizer_path), "--chunk-docs", "50",
              "--workers", "2", "--no-progress", "--json"]
    assert main(["build", *common, "--out", str(tmp_path / "local")]) == 0
    capsys.readouterr()
    assert main(["build", *common, "--out", str(tmp_path / "ray"), "--executor", "ray",
                 "--address", ray_address]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 516 and summary["new_chunks"] == 11
    assert_same_cache(tmp_path / "local", tmp_path / "ray")
    assert main(["build", *common, "--out", str(tmp_path / "x"), "--address", "h:1"]) == 2
    assert "needs executor='ray'" in capsys.readouterr().err


def test_a_bad_record_stops_the_ray_build_naming_it(tmp_path: Path, ray_address: str,
                                                   tokenizer_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
    with open(src, "a") as f:
        f.write("{not json\n")
    with pytest.raises(InputError, match=r"a\.jsonl:3"):
        build([src], tmp_path / "c", tokenizer=tokenizer_path, executor="ray", progress=False)


def test_options_are_checked(tmp_path: Path, ray_address: str, sample_corpus: Path,
                             tokenizer_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"executor must be one of \['local', 'ray'\]"):
        build([sample_corpus], tmp_path / "c", tokenizer=tokenizer_path, executor="dask")
    with pytest.raises(ConfigError, match="already connected to the Ray cluster"):
        RayExecutor(address="10.0.0.1:6379").connect()
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        RayExecutor(0)


def test_missing_ray_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     sample_corpus: Path, tokenizer_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    msg = "the Ray executor needs ray: pip install 'shardwise[ray]'"
    with pytest.raises(MissingExtraError) as e:
        build([sample_corpus], tmp_path / "c", tokenizer=tokenizer_path, executor="ray")
    assert str(e.value) == msg and not (tmp_path / "c").exists()
