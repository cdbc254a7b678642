"""A build never truncates or pads, whatever the tokenizer.json says (issue 11, item 1).

A tokenizer saved from an embedding or classifier model often has truncation and padding
on; a build with it once cut every document to 128 tokens without a word.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from tests.conftest import sample_texts
from tests.helpers_cache import cache_documents
from tokenizers import Tokenizer

from shardwise.cli import main as cli_main
from shardwise.writer.api import build
from shardwise.writer.chat import ChatProcessor
from shardwise.writer.processors import load_tokenizer

TEXTS = sample_texts()[:120]


def _truncating(tokenizer_path: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_truncation(128)
    tok.enable_padding(length=256, pad_id=0, pad_token="<|endoftext|>")
    return tok


def _reference(tokenizer_path: Path, texts: list[str]) -> list[list[int]]:
    clean = Tokenizer.from_file(str(tokenizer_path))
    assert clean.truncation is None and clean.padding is None
    return [clean.encode(t, add_special_tokens=False).ids for t in texts]




@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trunc") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return path


@pytest.mark.parametrize("given", ["path", "object"])
def test_a_truncating_tokenizer_stores_every_token(tmp_path: Path, tokenizer_path: Path,
                                                   corpus: Path, given: str) -> None:
    tok = _truncating(tokenizer_path)
    saved = tmp_path / "truncating.json"
    tok.save(str(saved))
    reference = _reference(tokenizer_path, TEXTS)
    assert max(map(len, reference)) > 128  # the tokenizer would cut these documents
    summary = build([corpus], tmp_path / "c", tokenizer=saved if given == "path" else tok,
                    workers=1, chunk_docs=50, progress=False)
    assert cache_documents(tmp_path / "c") == reference
    assert summary.tokens == sum(map(len, reference))
    assert tok.truncation is not None and tok.padding is not None  # the caller's, untouched
    processor = orjson.loads((tmp_path / "c" / "manifest.json").read_bytes())["processor"]
    assert processor["switched_off"]["truncation"]["max_length"] == 128
    assert processor["switched_off"]["padding"]["length"] == 256
    assert summary.notes == [
        "the tokenizer had truncation (max_length 128) and padding switched on; a build "
        "never truncates or pads, so they were switched off (recorded in the manifest)"]
    assert str(summary).count("truncation (max_length 128)") == 1


def test_a_clean_tokenizer_keeps_its_manifest_and_fingerprint(tmp_path: Path,
                                                              tokenizer_path: Path,
                                                              corpus: Path) -> None:
    """Nothing switched off: no note, no new manifest key, the fingerprint of before (so
    caches built before this change keep resuming)."""
    summary = build([corpus], tmp_path / "c", tokenizer=tokenizer_path, workers=1,
                    progress=False)
    manifest = orjson.loads((tmp_path / "c" / "manifest.json").read_bytes())
    assert "switched_off" not in manifest["processor"] and summary.notes == []
    loaded = load_tokenizer(tokenizer_path)
    assert loaded.json == tokenizer_path.read_text() and loaded.switched_off == {}
    # the object form gives the same cache identity as the file it was loaded from
    build([corpus], tmp_path / "c", tokenizer=Tokenizer.from_file(str(tokenizer_path)),
          workers=1, progress=False)


def test_the_cli_says_it_once(tmp_path: Path, tokenizer_path: Path, corpus: Path,
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "truncating.json"
    _truncating(tokenizer_path).save(str(saved))
    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ("build",))
    code = cli_main.main(["build", str(corpus), "--out", str(tmp_path / "c"), "--tokenizer",
                          str(saved), "--workers", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("note: the tokenizer had truncation (max_length 128) and padding") == 1
    assert cache_documents(tmp_path / "c") == _reference(tokenizer_path, TEXTS)


def test_chat_processor_loads_tokenizers_the_same_way(tokenizer_path: Path) -> None:
    tok = _truncating(tokenizer_path)
    chat = ChatProcessor(tok)
    long_answer = " ".join(TEXTS[:3])
    doc = chat({"messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": long_answer}]})
    assert doc is not None and len(doc["input_ids"]) > 256  # neither cut nor padded
    assert chat.settings()["switched_off"]["truncation"]["max_length"] == 128
    assert chat.tokenizer.truncation is None and chat.tokenizer.padding is None
