"""An empty text is data: a document of zero tokens, counted (issue 11, item 2).

The Python standard library has empty ``__init__.py`` files; a build refused the first
one. Megatron's preprocessing keeps such a document, and so must a build, every reader,
and Megatron-Core reading the chunks. A UTF-8 byte order mark starting a file is accepted.
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import orjson
import pytest
import zstandard
from tests.conftest import sample_texts
from tests.helpers_cache import cache_documents
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import shardwise as sw
from shardwise.cli import main as cli_main
from shardwise.errors import InputError
from shardwise.plan.stream import shuffled_stream_chunks
from shardwise.read.stream.dataset import StreamDataset
from shardwise.writer.api import build
from shardwise.writer.progress import BuildSummary

# empty, whitespace only (no ids for a whitespace pre-tokenizer), and real texts; with 2
# documents a chunk, the empties at the end and in a row join a chunk with tokens
TEXTS = ["", "   ", "\n\t"] + sample_texts()[:20] + ["", ""] + sample_texts()[20:31] + [""]


def _wordlevel() -> Tokenizer:
    """Splits on whitespace and drops it: a whitespace-only text encodes to no ids."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(sample_texts()[:40], trainers.WordLevelTrainer(
        vocab_size=3000, special_tokens=["[UNK]", "</s>"], show_progress=False))
    return tok




@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("empty") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return path


@pytest.fixture(scope="module")
def built(corpus: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, BuildSummary]:
    """The sample byte-level BPE, no --append-eod: empty texts are zero-length documents."""
    root = tmp_path_factory.mktemp("empty-cache") / "c"
    summary = build([corpus], root, tokenizer=Path(__file__).parents[2] / "sample" /
                    "tokenizer.json", chunk_docs=2, workers=1, progress=False)
    return root, summary


@pytest.mark.parametrize("append_eod", [False, True])
@pytest.mark.parametrize("which", ["bytelevel", "wordlevel"])
def test_empty_texts_are_documents(tmp_path: Path, corpus: Path, tokenizer_path: Path,
                                   which: str, append_eod: bool) -> None:
    tok = _wordlevel() if which == "wordlevel" else Tokenizer.from_file(str(tokenizer_path))
    eod = tok.token_to_id("</s>" if which == "wordlevel" else "<|endoftext|>")
    reference = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    empties = sum(not ids for ids in reference)
    assert empties == (6 if which == "wordlevel" else 4)  # whitespace: no ids, or tokens
    summary = build([corpus], tmp_path / "c", tokenizer=tok, chunk_docs=2, workers=1,
                    append_eod=append_eod, progress=False)
    suffix = [eod] if append_eod else []
    assert cache_documents(tmp_path / "c") == [ids + suffix for ids in reference]
    assert summary.documents == len(TEXTS) and summary.errors == {}
    assert summary.empty_documents == empties
    assert f"{len(TEXTS)} documents ({empties} empty)" in str(summary)
    ledger = orjson.loads((tmp_path / "c" / "ledger.json").read_bytes())
    chunks = ledger["sources"][0]["segments"][0]["chunks"]
    assert ledger["version"] == 3 and sum(c["empty"] for c in chunks) == empties


def test_inspect_counts_empty_documents(built: tuple[Path, BuildSummary],
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = built
    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ("inspect",))
    assert cli_main.main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{len(TEXTS)} documents (4 empty)," in out
    assert cli_main.main(["inspect", str(root), "--json"]) == 0
    totals = orjson.loads(capsys.readouterr().out)["totals"]
    assert totals["empty_documents"] == 4 and totals["documents"] == len(TEXTS)


def test_megatron_core_reads_the_empty_documents(built: tuple[Path, BuildSummary]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron warns about missing Apex / TE
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    root, _ = built
    cache = sw.open_cache(root)
    lengths, docs = [], []
    for chunk in cache.chunks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = IndexedDataset(str(chunk.base))
        lengths += ds.sequence_lengths.tolist()
        docs += [ds[d].tolist() for d in range(len(ds))]
    assert docs == cache_documents(root)
    assert lengths.count(0) == 4 and len(lengths) == len(TEXTS)
    # no chunk without tokens: numpy (so Megatron) cannot map an empty .bin
    assert all(chunk.tokens > 0 for chunk in cache.chunks)


def _stream(cache: sw.Cache) -> np.ndarray:
    return np.concatenate([cache.tokens(i) for i in range(len(cache.chunks))])


def test_token_dataset_over_empty_documents(built: tuple[Path, BuildSummary],
                                            tmp_path: Path) -> None:
    root, _ = built
    cache = sw.open_cache(root)
    stream = _stream(cache)
    ds = sw.TokenDataset(cache, seq_len=32, seed=3, shuffle="document", plan_dir=tmp_path,
                         drop_last=False)
    batch = ds.__getitems__(list(range(len(ds))))
    labels = np.sort(batch["labels"][batch["loss_mask"].astype(bool)])
    first = batch["input_ids"][0, 0]  # every token is a label once, but the first
    assert (labels == np.sort(np.delete(stream, np.flatnonzero(stream == first)[0]))).all()
    packed = sw.TokenDataset(cache, seq_len=32, seed=3, cu_seqlens=True,
                             reset_position_ids=True)
    batch = packed.__getitems__(list(range(len(packed))))
    cu = batch["cu_seqlens"]
    assert (np.diff(cu) > 0).all()  # an empty document adds no zero-length sequence
    assert batch["position_ids"].max() < 32


def test_stream_dataset_over_empty_documents(built: tuple[Path, BuildSummary]) -> None:
    root, _ = built
    cache = sw.open_cache(root)
    ds = StreamDataset(cache, seq_len=8, streams=1, seed=5, block_chunks=3,
                       world=sw.World(0, 1), epochs=1)
    got = sorted(tuple(e["input_ids"].tolist()) + (int(e["labels"][-1]),) for e in ds)
    order = shuffled_stream_chunks(0, len(cache.chunks), 1, seed=5, epoch=0, block_chunks=3)
    want = []
    for b in range(0, len(order), 3):  # each block's windows of 9 tokens, cut in order
        toks = np.concatenate([cache.tokens(int(c)) for c in order[b:b + 3]])
        want += [tuple(toks[w * 8:w * 8 + 9].tolist()) for w in range((len(toks) - 1) // 8)]
    assert got == sorted(want) and len(got) > 0


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_byte_order_mark_starts_a_file(tmp_path: Path, tokenizer_path: Path,
                                         suffix: str) -> None:
    lines = [json.dumps({"text": t}).encode() for t in sample_texts()[:5]]
    payload = b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n"
    blob = {".jsonl": lambda b: b, ".jsonl.gz": gzip.compress,
            ".jsonl.zst": zstandard.ZstdCompressor().compress}[suffix](payload)
    src = tmp_path / f"bom{suffix}"
    src.write_bytes(blob)
    summary = build([src], tmp_path / "c", tokenizer=tokenizer_path, workers=1,
                    progress=False)
    tok = Tokenizer.from_file(str(tokenizer_path))
    assert cache_documents(tmp_path / "c") == [tok.encode(t, add_special_tokens=False).ids
                                          for t in sample_texts()[:5]]
    assert summary.errors == {}


def test_an_empty_line_is_still_bad_input_and_lines_count_after_a_bom(
        tmp_path: Path, tokenizer_path: Path) -> None:
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b'\xef\xbb\xbf{"text": "a"}\n{"text": ""}\n\n{"text": "b"}\n')
    with pytest.raises(InputError, match=r"bom.jsonl:3: empty line") as info:
        build([src], tmp_path / "c", tokenizer=tokenizer_path, workers=1, progress=False)
    assert info.value.reason == "empty_line"


def test_a_version_1_ledger_still_opens(built: tuple[Path, BuildSummary], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Caches built before the count existed open, inspect, and read as before (their
    empty documents are not counted: ``empty`` reads as 0)."""
    import shutil

    root = tmp_path / "v1"
    shutil.copytree(built[0], root)
    ledger = orjson.loads((root / "ledger.json").read_bytes())
    ledger["version"] = 1
    for seg in ledger["sources"][0]["segments"]:
        for chunk in seg["chunks"]:
            del chunk["empty"]
    (root / "ledger.json").write_bytes(orjson.dumps(ledger, option=orjson.OPT_SORT_KEYS))
    assert cache_documents(root) == cache_documents(built[0])
    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ("inspect",))
    assert cli_main.main(["inspect", str(root)]) == 0
    assert f"{len(TEXTS)} documents, " in capsys.readouterr().out
