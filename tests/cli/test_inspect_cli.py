"""``shardwise inspect``: totals, status, histogram, JSON, a real PNG, packed examples."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from shardwise.writer.convert import to_megatron

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cachefactory import make_cache, sample_docs  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def docs() -> list[list[int]]:
    return sample_docs(200, seed=4)


@pytest.fixture
def cache(tmp_path: Path, docs: list[list[int]]) -> Path:
    return make_cache(tmp_path / "c", [docs[:150], docs[150:]], chunk_docs=16)


def test_text_report_has_totals_status_and_histogram(cli, cache: Path,
                                                     docs: list[list[int]]) -> None:
    code, out, _ = cli("inspect", cache)
    assert code == 0
    tokens = sum(map(len, docs))
    assert f"totals: 2 sources, 14 chunks, 200 documents, {tokens:,} tokens" in out
    assert "status: finished" in out and "skipped records: none" in out
    assert "(all 200 documents;" in out
    bars = [line for line in out.splitlines() if "│" in line]
    counts = [int(re.search(r"([\d,]+) \(\s*[\d.]+%\)$", line)[1].replace(",", ""))
              for line in bars]
    assert sum(counts) == 200
    assert max(line.count("█") for line in bars) == 40
    longest = max(len(d) for d in docs)
    lo, hi = (int(x.replace(",", "")) for x in bars[-1].split("│")[0].split("–"))
    assert lo <= longest <= hi


def test_json_parses_and_matches(cli, cache: Path, docs: list[list[int]]) -> None:
    code, out, _ = cli("inspect", cache, "--json")
    d = orjson.loads(out)
    assert code == 0 and d["status"] == "finished"
    assert d["totals"]["documents"] == 200 and d["totals"]["tokens"] == sum(map(len, docs))
    assert [s["documents"] for s in d["sources"]] == [150, 50]
    assert sum(c for _, _, c in d["lengths"]["buckets"]) == 200


def test_a_building_cache_and_skip_counts(cli, tmp_path: Path, docs: list[list[int]]) -> None:
    root = make_cache(tmp_path / "b", [docs[:50], docs[50:90]], chunk_docs=8,
                      unfinished_last=True)
    ledger = orjson.loads((root / "ledger.json").read_bytes())
    ledger["sources"][0]["segments"][0]["errors"] = {"invalid_json": 3, "empty": 1}
    (root / "ledger.json").write_bytes(orjson.dumps(ledger))
    code, out, _ = cli("inspect", root)
    assert code == 0 and "status: building" in out
    assert "skipped records: empty 1, invalid_json 3" in out


def test_a_huge_cache_is_sampled(cli, cache: Path) -> None:
    code, out, _ = cli("inspect", cache, "--sample-docs", "20")
    assert code == 0 and "a sample of" in out


def test_plot_writes_a_real_png(cli, cache: Path, tmp_path: Path) -> None:
    import matplotlib.image

    png = tmp_path / "out" / "lengths.png"
    code, out, _ = cli("inspect", cache, "--plot", png)
    assert code == 0 and f"plot written to {png}" in out
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 300 and image.shape[1] >= 800
    assert np.unique(image.reshape(-1, image.shape[-1]), axis=0).shape[0] > 10  # not blank


def test_plot_without_matplotlib_says_how_to_install(cli, cache: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    code, _, err = cli("inspect", cache, "--plot", tmp_path / "x.png")
    assert code == 2 and "pip install 'shardwise[plot]'" in err


def test_examples_print_packed_windows(cli, cache: Path, docs: list[list[int]]) -> None:
    stream = [t for d in docs for t in d]
    code, out, _ = cli("inspect", cache, "--examples", "3", "--seq-len", "5")
    assert code == 0
    for i in range(3):
        window = " ".join(map(str, stream[5 * i:5 * i + 6]))
        assert f"example {i} (tokens {5 * i}..{5 * i + 6}):\n{window}" in out


def test_examples_decoded_with_a_tokenizer(cli, cache: Path, tmp_path: Path,
                                           docs: list[list[int]]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    code, out, _ = cli("inspect", cache, "--examples", "1", "--seq-len", "4",
                       "--tokenizer", tmp_path / "tok.json", "--json")
    stream = [t for d in docs for t in d]
    example = orjson.loads(out)["examples"][0]
    assert code == 0 and example["ids"] == stream[:5]
    assert example["text"] == " ".join(f"w{t}" for t in stream[:5])


def test_examples_from_a_damaged_chunk_are_refused_unless_trusted(cli, cache: Path) -> None:
    path = cache / "chunks/00000/00000-00000.bin"
    data = bytearray(path.read_bytes())
    data[4] ^= 0x01  # an id that stays inside the vocabulary: only the checksum can tell
    path.write_bytes(bytes(data))
    code, out, err = cli("inspect", cache, "--examples", "2", "--seq-len", "5")
    assert code != 0 and "example 0" not in out
    assert f"{path}: xxh3_64" in err
    code, out, _ = cli("inspect", cache, "--examples", "2", "--seq-len", "5", "--no-verify")
    assert code == 0 and "example 1 (tokens 5..11)" in out


def test_examples_need_seq_len(cli, cache: Path) -> None:
    code, _, err = cli("inspect", cache, "--examples", "2")
    assert code == 2 and "--seq-len" in err


def test_a_megatron_prefix(cli, cache: Path, tmp_path: Path) -> None:
    to_megatron(cache, tmp_path / "corpus_text_document")
    code, out, _ = cli("inspect", tmp_path / "corpus_text_document")
    assert code == 0 and out.startswith("megatron cache")
    assert "200 documents" in out and "(all 200 documents;" in out
    code, out, _ = cli("inspect", tmp_path / "corpus_text_document", "--examples", "1",
                       "--seq-len", "3")
    assert code == 0 and "example 0 (tokens 0..4)" in out


def test_a_record_cache(cli, tmp_path: Path, docs: list[list[int]]) -> None:
    root = make_cache(tmp_path / "r", [docs[:30]], chunk_docs=8, kind="records")
    code, out, _ = cli("inspect", root, "--json")
    d = orjson.loads(out)
    assert code == 0 and d["chunk_kind"] == "records"
    assert d["lengths"]["documents"] == 30 and d["lengths"]["max"] == max(map(len, docs[:30]))


def test_help(cli) -> None:
    code, out, _ = cli("inspect", "--help")
    assert code == 0 and "--plot FILE.png" in out and "--examples N" in out


@pytest.mark.parametrize("seq_len", [7, 64])
def test_seq_len_says_what_a_token_dataset_drops(cli, cache: Path, docs: list[list[int]],
                                                 seq_len: int) -> None:
    import shardwise as sw

    ds = sw.TokenDataset(cache, seq_len=seq_len)
    tokens = sum(map(len, docs))
    (drop,) = ds.drops() or [None]
    dropped = drop.count if drop else 0
    code, out, _ = cli("inspect", cache, "--seq-len", seq_len)
    assert code == 0
    assert (f"with --seq-len {seq_len}: {len(ds):,} windows of {seq_len + 1} tokens; the last "
            f"{dropped:,} of {tokens:,} tokens") in out
    assert dropped == tokens - (len(ds) * seq_len + 1) > 0
    code, out, _ = cli("inspect", cache, "--seq-len", seq_len, "--json")
    assert orjson.loads(out)["windows"] == {
        "seq_len": seq_len, "tokens": tokens, "windows": len(ds), "dropped_tokens": dropped,
        "windows_padded": len(sw.TokenDataset(cache, seq_len=seq_len, drop_last=False))}
