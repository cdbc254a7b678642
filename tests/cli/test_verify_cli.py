"""``shardwise verify``: exit 0 on an intact cache, 1 naming every damaged file."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from shardwise.format.ledger_index import INDEX_NAME
from shardwise.writer.convert import to_megatron

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    docs = sample_docs(20, seed=2)
    return make_cache(tmp_path / "c", [docs[:12], docs[12:]], chunk_docs=3)


def test_an_intact_cache_exits_0(cli, cache: Path) -> None:
    code, out, _ = cli("verify", cache)
    assert code == 0
    assert out.startswith(f"OK {cache}: 7 chunks")


def test_damaged_files_are_printed_and_exit_1(cli, cache: Path) -> None:
    bin_path = cache / "chunks/00000/00000-00001.bin"
    idx_path = cache / "chunks/00001/00000-00002.idx"
    bin_path.write_bytes(bin_path.read_bytes()[:-1])
    idx_path.unlink()
    code, out, _ = cli("verify", cache)
    assert code == 1
    bad = [line for line in out.splitlines() if line.startswith("BAD ")]
    assert {line.split(": ")[0] for line in bad} == {f"BAD {bin_path}", f"BAD {idx_path}"}
    assert out.splitlines()[-1].startswith(f"FAILED {cache}: ")
    assert out.splitlines()[-1].endswith(
        "rerun the same build command: it checks every chunk and rebuilds the 2 damaged "
        "chunks, byte-identical (or restore them from a copy)")


def test_a_damaged_ledger_is_not_advised_to_be_rebuilt(cli, cache: Path) -> None:
    (cache / "ledger.json").write_bytes(b"{")
    code, out, _ = cli("verify", cache)
    assert code == 1
    assert out.splitlines()[-1].endswith(
        "ledger.json cannot be repaired by rerunning the build: restore it from a copy, or "
        "build the cache again with --overwrite")


def test_json_report(cli, cache: Path) -> None:
    (cache / "chunks/00000/00000-00000.json").write_bytes(b"{}")
    code, out, _ = cli("verify", cache, "--json")
    report = orjson.loads(out)
    assert code == 1 and report["ok"] is False
    assert report["problems"][0]["path"] == str(cache / "chunks/00000/00000-00000.json")


def test_quick_checks_headers_and_sizes(cli, cache: Path) -> None:
    code, out, _ = cli("verify", cache, "--quick")
    assert code == 0
    assert out == f"OK {cache}: 7 chunks checked (headers and sizes only: --quick)\n"
    idx_path = cache / "chunks/00001/00000-00002.idx"
    idx_path.write_bytes(b"NOTMEGATRON" + idx_path.read_bytes()[11:])
    code, out, _ = cli("verify", cache, "--quick", "--json")
    report = orjson.loads(out)
    assert code == 1 and report["quick"] is True
    assert [p["path"] for p in report["problems"]] == [str(idx_path)]
    assert "bad magic" in report["problems"][0]["what"]


def test_quick_is_for_local_caches(cli) -> None:
    code, _, err = cli("verify", "s3://bucket/cache", "--quick")
    assert code == 2 and "--quick checks a local cache directory" in err


def test_a_damaged_ledger_index_is_rewritten_by_a_rerun(cli, cache: Path) -> None:
    index = cache / INDEX_NAME
    index.write_bytes(index.read_bytes()[:-8])
    code, out, _ = cli("verify", cache)
    assert code == 1 and f"BAD {index}: " in out
    assert out.splitlines()[-1].endswith(
        f"rerun the same build command: it rewrites {INDEX_NAME} (readers ignore it until "
        "then)")


def test_a_megatron_prefix_is_verified(cli, cache: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "corpus"
    to_megatron(cache, prefix)
    assert cli("verify", prefix)[0] == 0
    Path(f"{prefix}.bin").write_bytes(b"\0")
    code, out, _ = cli("verify", prefix)
    assert code == 1 and f"BAD {prefix}.bin: " in out
    assert out.splitlines()[-1].endswith("restore the named files from a copy")


def test_a_path_that_is_no_cache_is_a_usage_error(cli, tmp_path: Path) -> None:
    code, _, err = cli("verify", tmp_path / "nothing")
    assert code == 2 and "neither a cache directory" in err


def test_help(cli) -> None:
    code, out, _ = cli("verify", "--help")
    assert code == 0
    assert "every chunk" in out


def test_the_installed_entry_point(cache: Path) -> None:
    """The command a user types, in a fresh process (all subcommands registered)."""
    import os
    import subprocess

    import shardwise

    src = str(Path(shardwise.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    (cache / "chunks/00000/00000-00000.idx").write_bytes(b"MMIDIDX")
    done = subprocess.run([sys.executable, "-m", "shardwise.cli.main", "verify", str(cache)],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1, done.stderr
    assert f"BAD {cache / 'chunks/00000/00000-00000.idx'}: " in done.stdout
