"""``shardwise convert``: both directions, and clear usage errors."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

import shardwise

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    docs = sample_docs(30, seed=8)
    return make_cache(tmp_path / "c", [docs[:11], docs[11:]], chunk_docs=4)


def test_round_trip_through_the_cli(cli, cache: Path, tmp_path: Path) -> None:
    code, out, _ = cli("convert", cache, "--to-megatron", tmp_path / "m1" / "corpus")
    assert code == 0 and "30 documents" in out
    code, out, _ = cli("convert", "--from-megatron", tmp_path / "m1" / "corpus",
                       "--out", tmp_path / "c2", "--chunk-docs", "7")
    assert code == 0 and "5 chunks" in out
    assert len(shardwise.open_cache(tmp_path / "c2").chunks) == 5
    code, out, _ = cli("convert", tmp_path / "c2", "--to-megatron", tmp_path / "m2" / "corpus",
                       "--json")
    assert code == 0 and orjson.loads(out)["documents"] == 30
    for suffix in (".bin", ".idx"):
        assert (Path(f"{tmp_path / 'm1' / 'corpus'}{suffix}").read_bytes()
                == Path(f"{tmp_path / 'm2' / 'corpus'}{suffix}").read_bytes())


def test_chunk_mb(cli, cache: Path, tmp_path: Path) -> None:
    cli("convert", cache, "--to-megatron", tmp_path / "corpus")
    code, _, _ = cli("convert", "--from-megatron", tmp_path / "corpus", "--out",
                     tmp_path / "c2", "--chunk-mb", "0.0005")
    assert code == 0 and len(shardwise.open_cache(tmp_path / "c2").chunks) > 1


@pytest.mark.parametrize(("argv", "message"), [
    ([], "one of the arguments --to-megatron --megatron-data-path --from-megatron "
     "--from-numpy is required"),
    (["c", "--to-megatron", "p", "--from-megatron", "p"], "not allowed with argument"),
    (["--to-megatron", "p"], "needs the cache directory DIR"),
    (["c", "--to-megatron", "p", "--out", "o"], "--out applies only to --from-megatron"),
    (["--from-megatron", "p"], "needs --out DIR"),
    (["c", "--from-megatron", "p", "--out", "o"], "takes no DIR argument"),
    (["--from-megatron", "p", "--out", "o", "--chunk-docs", "3", "--chunk-mb", "1"],
     "not allowed with argument"),
    (["--from-megatron", "p", "--out", "o", "--chunk-docs", "0"], "positive integer"),
])
def test_usage_errors(cli, argv: list[str], message: str) -> None:
    code, _, err = cli("convert", *argv)
    assert code == 2
    assert message in err and "usage: shardwise convert" in err


def test_an_unfinished_cache_needs_allow_partial(cli, tmp_path: Path) -> None:
    docs = sample_docs(12, seed=1)
    root = make_cache(tmp_path / "c", [docs[:6], docs[6:]], chunk_docs=2, unfinished_last=True)
    code, _, err = cli("convert", root, "--to-megatron", tmp_path / "corpus")
    assert code == 2 and "--allow-partial" in err
    code, out, _ = cli("convert", root, "--to-megatron", tmp_path / "corpus", "--allow-partial")
    assert code == 0 and "note: partial" in out


def test_help(cli) -> None:
    code, out, _ = cli("convert", "--help")
    assert code == 0 and "--to-megatron PREFIX" in out and "--chunk-docs" in out


def test_megatron_data_path_prints_the_weighted_chunk_list(cli, cache: Path) -> None:
    code, out, err = cli("convert", cache, "--megatron-data-path", "--seq-len", "8")
    assert code == 0
    items = out.split()
    c = shardwise.open_cache(cache)
    assert items[0::2] == [str(ch.tokens) for ch in c.chunks if ch.tokens]
    assert items[1::2] == [str(ch.base.resolve()) for ch in c.chunks if ch.tokens]
    windows = (c.num_tokens - 1) // 8
    per_chunk = sum((ch.tokens - 1) // 8 for ch in c.chunks if ch.tokens)
    assert f"instead of {windows:,} ({windows - per_chunk:,} lost" in err
    code, out, _ = cli("convert", cache, "--megatron-data-path", "--json")
    assert code == 0 and orjson.loads(out)["items"] == items


def test_megatron_data_path_usage_errors(cli, cache: Path) -> None:
    code, _, err = cli("convert", "--megatron-data-path")
    assert code == 2 and "needs the cache directory" in err
    code, _, err = cli("convert", cache, "--to-megatron", "x", "--seq-len", "8")
    assert code == 2 and "--seq-len applies only" in err


def test_a_damaged_chunk_is_refused_unless_no_verify(cli, cache: Path, tmp_path: Path) -> None:
    victim = Path(f"{shardwise.open_cache(cache).chunks[3].base}.bin")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    code, out, err = cli("convert", cache, "--to-megatron", tmp_path / "m" / "corpus")
    assert code != 0 and not out
    assert f"{victim}: xxh3_64" in err and f"shardwise verify {cache}" in err
    assert list((tmp_path / "m").iterdir()) == []
    code, out, _ = cli("convert", cache, "--to-megatron", tmp_path / "m" / "corpus",
                       "--no-verify")
    assert code == 0 and "30 documents" in out
    code, _, err = cli("convert", cache, "--megatron-data-path", "--no-verify")
    assert code == 2 and "--no-verify applies only to --to-megatron" in err
