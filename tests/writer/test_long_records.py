"""A huge record costs bounded memory (issue 11, item 5).

A 100 MB one-line record took 12 GB to build (the tokenizer's whole Encoding), and a
300 MB line over ``max_record_bytes`` was read whole before it was refused. Now a long
text is encoded window by window with exactly the ids of encoding it whole
(:mod:`shardwise.writer.long_text`), or refused by name; an over-long line is counted
while it streams past.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import sample_texts
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from shardwise.errors import InputError
from shardwise.format.ledger import Segment
from shardwise.format.manifest import SourceInfo
from shardwise.sources.records import iter_records
from shardwise.writer import long_text
from shardwise.writer.api import build

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 4,000 characters: a 25 k text is cut six times. (The longest run without
    a cut in :func:`_adversarial` is 900 characters, well under a window.)"""
    monkeypatch.setattr(long_text, "SPLIT_CHARS", 1000)
    monkeypatch.setattr(long_text, "PIECE_CHARS", 4000)
    monkeypatch.setattr(long_text, "MARGIN_CHARS", 200)


def _bytelevel_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(sample_texts()[:150], trainers.BpeTrainer(
        vocab_size=800, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(sample_texts()[:150], trainers.WordPieceTrainer(
        vocab_size=1500, special_tokens=["[UNK]", "[SEP]"], show_progress=False))
    return tok


MAKERS = {"bytelevel-bpe": _bytelevel_bpe, "wordpiece": _wordpiece}


def _adversarial(rng: random.Random, n: int) -> str:
    """Prose, code, runs without spaces (letters, digits, punctuation), whitespace runs,
    CRLF, combining marks, CJK, emoji and special-token text, in random order."""
    texts = sample_texts()
    pieces = ["x" * 300, "7" * 157, "=" * 120, "\u0301" * 5, "e\u0301", "中文字符", "🙂" * 9,
              " " * 70, "\n" * 9, "\r\n", "\t \t", "[SEP]", "a.b,c;d", "über", "\u3000"]
    out: list[str] = []
    while sum(map(len, out)) < n:
        r = rng.random()
        if r < 0.35:
            t = rng.choice(texts)
            a = rng.randrange(len(t))
            out.append(t[a:a + rng.randint(1, 2000)])
        else:
            out.append(rng.choice(pieces) * rng.randint(1, 3))
    return "".join(out)


@pytest.mark.parametrize("which", sorted(MAKERS))
def test_split_encoding_equals_whole_encoding(small_windows: None, which: str) -> None:
    tok = MAKERS[which]()
    tok.add_special_tokens(["[SEP]"])
    rng = random.Random(11)
    for _ in range(12):
        text = _adversarial(rng, rng.randint(4000, 25000))
        got = long_text.encode_long(tok, text)
        assert not isinstance(got, InputError), got
        assert got.tolist() == tok.encode(text, add_special_tokens=False).ids


def test_unsafe_tokenizers_are_refused_not_guessed(small_windows: None) -> None:
    text = "plain words and more words " * 1000
    no_pre = _bytelevel_bpe()
    no_pre.pre_tokenizer = None
    err = long_text.encode_long(no_pre, text)
    assert isinstance(err, InputError) and err.reason == "unsplittable"
    assert "no pre-tokenizer" in str(err)
    strip = _bytelevel_bpe()  # strips each piece's leading spaces: every cut here changes ids
    strip.normalizer = normalizers.Strip()
    err = long_text.encode_long(strip, text)
    assert isinstance(err, InputError) and "no cut between characters" in str(err)
    rng = random.Random(5)  # whatever the text: the whole encoding's ids, or a refusal
    for _ in range(8):
        t = _adversarial(rng, 8000)
        got = long_text.encode_long(strip, t)
        assert isinstance(got, InputError) or got.tolist() == strip.encode(t).ids


def test_a_record_that_cannot_be_split_is_named(small_windows: None, tmp_path: Path) -> None:
    tok = _bytelevel_bpe()
    tok.pre_tokenizer = None
    src = tmp_path / "f.jsonl"
    src.write_text("\n".join(json.dumps({"text": t}) for t in
                             ["short", "word " * 400, "also short"]) + "\n")
    with pytest.raises(InputError, match=r"f.jsonl:2: a text of 2,000 characters") as info:
        build([src], tmp_path / "a", tokenizer=tok, workers=1, progress=False)
    assert info.value.reason == "unsplittable"
    summary = build([src], tmp_path / "b", tokenizer=tok, workers=1, on_error="skip",
                    progress=False)
    assert summary.errors == {"unsplittable": 1} and summary.documents == 2


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_an_over_limit_line_is_counted_not_held(tmp_path: Path, suffix: str) -> None:
    """A 48 MB line against a 1 MB limit: Python never holds more than a few MB (a plain
    file: one read block; a compressed one: up to the limit, it cannot seek back)."""
    big = b'{"text": "' + b"y" * (48 << 20) + b'"}'
    payload = b'{"text": "a"}\n' + big + b'\n{"text": "b"}\n'
    src = tmp_path / f"big{suffix}"
    src.write_bytes(gzip.compress(payload, 1) if suffix.endswith("gz") else payload)
    del big, payload
    info = SourceInfo(str(src), src.stat().st_size, "", suffix.lstrip("."))
    tracemalloc.start()
    try:
        got = [(loc.value, loc.end, loc.line) for loc in
               iter_records(info, Segment(0, -1, 0), 0, 0, max_record_bytes=1 << 20)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak:,} bytes"
    assert [v for v, _, _ in got][::2] == [{"text": "a"}, {"text": "b"}]
    err = got[1][0]
    assert isinstance(err, InputError) and err.reason == "too_large" and err.line == 2
    assert f"record of {(48 << 20) + 12} bytes exceeds max_record_bytes=1048576" in str(err)
    assert [end for _, end, _ in got] == [14, 14 + (48 << 20) + 13, 14 + (48 << 20) + 27]


WORDS = 3000  # a vocabulary of 12-character words: a 100 MB text is 8 M tokens

# The peak of this process is its own VmHWM, not ru_maxrss of RUSAGE_SELF: Linux keeps,
# across exec, the high-water mark of the memory the process had before it, and Python's
# subprocess starts it by vfork, so that memory is the test runner's: a pytest process
# that once held 8 GB made this build "peak" at 8 GB. Its workers (forked, not exec'd)
# report their own peaks through RUSAGE_CHILDREN.
RSS_CHILD = textwrap.dedent("""
    import resource, sys
    from shardwise.writer.api import build
    summary = build([sys.argv[1]], sys.argv[2], tokenizer=sys.argv[3], workers=1,
                    progress=False)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    peak = max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(summary.tokens, peak * 1024)
""")


@pytest.mark.slow
def test_a_100_mb_record_builds_in_bounded_memory(tmp_path: Path) -> None:
    """One 100 MB line, built in a real subprocess: peak RSS of every process of the build
    < 1 GB (it was 12 GB), whatever the test runner's own peak, and the tokens are exactly
    the whole text's."""
    words = [f"w{i:010d}x" for i in range(WORDS)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    order = (np.arange(80_000, dtype=np.int64) * 7919) % WORDS  # 1 MB of text per block
    block = " ".join(words[i] for i in order) + " "
    assert tok.encode(block).ids == (order + 1).tolist()
    repeats = (100 << 20) // len(block) + 1
    with open(tmp_path / "huge.jsonl", "w") as f:
        f.write('{"text": "')
        for _ in range(repeats):
            f.write(block)
        f.write('"}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(tmp_path / "huge.jsonl"),
                          str(tmp_path / "c"), str(tmp_path / "tok.json")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    tokens, peak = map(int, out.stdout.split())
    assert peak < 1 << 30, f"peak RSS {peak / 2**20:,.0f} MB"
    assert tokens == repeats * len(order)
    stored = np.fromfile(tmp_path / "c" / "chunks" / "00000" / "00000-00000.bin",
                         dtype=np.uint16)
    assert (stored.reshape(repeats, len(order)) == order + 1).all()
