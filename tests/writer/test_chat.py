"""ChatProcessor: the loss mask lies exactly on assistant tokens, checked token by token."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import shardwise as sw
from shardwise.errors import ConfigError, InputError
from shardwise.format.chunk import IGNORE_INDEX
from shardwise.writer.chat import ChatProcessor
from shardwise.writer.chat_template import BUILTIN_TEMPLATE

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>"]
LLAMA = ("{{ bos_token }}{% for m in messages %}"
         "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] "
         "+ '<|eot_id|>' }}{% endfor %}"
         "{% if add_generation_prompt %}"
         "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tok(sample_corpus: Path) -> Tokenizer:
    """A small byte-level BPE trained here, with ChatML and Llama-3 style specials."""
    texts = [json.loads(line)["text"] for line in sample_corpus.read_text().splitlines()[:200]]
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=500, special_tokens=SPECIALS + LLAMA_SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t


def msgs(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


CASES = {
    "single_turn": msgs(("user", "What is the capital of France?"),
                        ("assistant", "Paris, of course.")),
    "multi_turn": msgs(("user", "Hi"), ("assistant", "Hello! How can I help?"),
                       ("user", "Count to three."), ("assistant", "One, two, three."),
                       ("user", "Thanks"), ("assistant", "You're welcome.")),
    "system_prompt": msgs(("system", "You are terse."), ("user", "Explain tides"),
                          ("assistant", "The moon pulls the sea.")),
    "assistant_first": msgs(("assistant", "Welcome! Ask me anything."), ("user", "ok"),
                            ("assistant", "Great.")),
    "empty_content": msgs(("user", ""), ("assistant", ""), ("user", "again"),
                          ("assistant", " spaced  out ")),
    "no_assistant": msgs(("system", "s"), ("user", "only a question")),
}


def expected_chatml(tok: Tokenizer, record: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Ids and mask written out by hand: header untrained, assistant body + end trained."""
    ids: list[int] = []
    mask: list[int] = []
    for m in record["messages"]:
        head = tok.encode(f"<|im_start|>{m['role']}\n", add_special_tokens=False).ids
        body = tok.encode(f"{m['content']}<|im_end|>\n", add_special_tokens=False).ids
        ids += head + body
        mask += [0] * len(head) + [int(m["role"] == "assistant")] * len(body)
    return ids, mask


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Maximal [start, stop) runs of ones."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(),
                    strict=True))


@pytest.mark.parametrize("case", sorted(CASES))
def test_mask_is_exactly_the_assistant_tokens(tok: Tokenizer, case: str) -> None:
    rec = CASES[case]
    chat = ChatProcessor(tok)
    doc = chat(rec)
    assert doc is not None
    ids, mask = expected_chatml(tok, rec)
    full = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                   for m in rec["messages"])
    assert ids == tok.encode(full, add_special_tokens=False).ids  # canonical tokenization
    assert doc["input_ids"].tolist() == ids
    assert doc["loss_mask"].tolist() == mask
    for t, (i, m) in enumerate(zip(ids, mask, strict=True)):  # token by token
        assert doc["labels"][t] == (i if m else IGNORE_INDEX)
    answers = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
    spans = runs(doc["loss_mask"])
    assert len(spans) == len(answers)
    for (a, b), text in zip(spans, answers, strict=True):
        got = tok.decode(doc["input_ids"][a:b].tolist(), skip_special_tokens=False)
        assert got == f"{text}<|im_end|>\n"
    assert chat.counts["per_piece"] == 0


def test_train_on_other_roles_and_sample_tokenizer(tokenizer_path: Path) -> None:
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    rec = CASES["system_prompt"]
    doc = ChatProcessor(tok, train_on=("assistant", "system"))(rec)
    assert doc is not None
    ids, mask = expected_chatml(tok, rec)
    head = len(tok.encode("<|im_start|>system\n", add_special_tokens=False).ids)
    system_turn = len(tok.encode("<|im_start|>system\nYou are terse.<|im_end|>\n",
                                 add_special_tokens=False).ids)
    mask[:system_turn] = [1] * system_turn  # a non-assistant trained turn: all of it
    assert head > 0 and doc["input_ids"].tolist() == ids and doc["loss_mask"].tolist() == mask


def test_truncation_keeps_the_mask_of_the_kept_prefix(tok: Tokenizer) -> None:
    rec = CASES["multi_turn"]
    full = ChatProcessor(tok)(rec)
    assert full is not None
    n = len(full["input_ids"])
    first_trained = int(np.flatnonzero(full["loss_mask"])[0])
    for k in (first_trained + 1, n // 2, n - 1, n):
        chat = ChatProcessor(tok, max_length=k)
        doc = chat(rec)
        assert doc is not None
        for key in ("input_ids", "labels", "loss_mask"):
            assert doc[key].tolist() == full[key][:k].tolist()
        assert chat.counts["truncated"] == int(k < n)
    cut = ChatProcessor(tok, max_length=first_trained)  # would keep no trained token
    out = cut.process([rec])[0]
    assert isinstance(out, InputError) and out.reason == "too_long"


def test_drop_is_counted_by_reason(tok: Tokenizer) -> None:
    chat = ChatProcessor(tok, max_length=20, overflow="drop")
    short = msgs(("user", "a"), ("assistant", "b"))
    out = chat.process([CASES["multi_turn"], short])
    assert isinstance(out[0], InputError) and out[0].reason == "too_long"
    assert isinstance(out[1], dict)
    assert chat(CASES["multi_turn"]) is None and chat(CASES["single_turn"]) is None
    assert chat.counts["too_long"] == 2
    with pytest.raises(ConfigError, match="overflow must be one of"):
        ChatProcessor(tok, overflow="wrap")


def test_bad_records_are_named(tok: Tokenizer) -> None:
    chat = ChatProcessor(tok)
    bad = [{"text": "no messages"}, {"messages": "hi"}, {"messages": []},
           {"messages": [{"role": "user"}, {"content": "x"}]},
           {"messages": [{"role": "user", "content": 3}]}]
    reasons = [e.reason for e in chat.process(bad)]  # type: ignore[union-attr]
    assert reasons == ["missing_field"] + ["bad_messages"] * 4
    strict = ChatProcessor(tok, template="{% if messages[0]['role'] == 'system' %}"
                           "{{ raise_exception('no system role') }}{% endif %}"
                           + BUILTIN_TEMPLATE)
    err = strict.process([CASES["system_prompt"]])[0]
    assert isinstance(err, InputError) and err.reason == "template_error"
    assert "no system role" in str(err)


def test_jinja_template_string_file_and_tokenizer_config(tok: Tokenizer, tmp_path: Path
                                                         ) -> None:
    rec = CASES["multi_turn"]
    by_string = ChatProcessor(tok, template=LLAMA, bos_token="<|begin_of_text|>")
    doc = by_string(rec)
    assert doc is not None
    text = "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        for m in rec["messages"])
    assert doc["input_ids"].tolist() == tok.encode(text, add_special_tokens=False).ids
    answers = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
    spans = runs(doc["loss_mask"])
    assert [tok.decode(doc["input_ids"][a:b].tolist(), skip_special_tokens=False)
            for a, b in spans] == [f"{a}<|eot_id|>" for a in answers]
    (tmp_path / "chat.jinja").write_text(LLAMA)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA}))
    (tmp_path / "tok.json").write_text(tok.to_str())
    for template in (tmp_path / "chat.jinja", str(tmp_path / "tokenizer_config.json")):
        other = ChatProcessor(tmp_path / "tok.json", template=template,
                              bos_token="<|begin_of_text|>")
        again = other(rec)
        assert again is not None
        assert all((again[k] == doc[k]).all() for k in doc)
        assert other.settings()["template_sha256"] == by_string.settings()["template_sha256"]
    with pytest.raises(ConfigError, match="neither Jinja text"):
        ChatProcessor(tok, template=str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match="syntax error"):
        ChatProcessor(tok, template="{% for m in messages %}{{ m }}")


def test_sandbox_violations_are_refused(tok: Tokenizer) -> None:
    for evil in ("{{ ''.__class__.__mro__[1].__subclasses__() }}" + BUILTIN_TEMPLATE,
                 "{{ messages['__class__'] }}" + BUILTIN_TEMPLATE,
                 "{{ cycler.__init__.__globals__.os }}" + BUILTIN_TEMPLATE):
        with pytest.raises(ConfigError, match="sandbox|internals"):
            ChatProcessor(tok, template=evil)
    with pytest.raises(ConfigError, match="sandbox"):  # caught by the probe render
        ChatProcessor(tok, template="{{ messages.append(1) }}" + BUILTIN_TEMPLATE)
    sneaky = ChatProcessor(tok, template="{% if messages|length > 3 %}"
                           "{{ messages.pop() }}{% endif %}" + BUILTIN_TEMPLATE)
    with pytest.raises(ConfigError, match="sandbox"):  # never swallowed as a bad record
        sneaky.process([CASES["multi_turn"]])


def test_per_piece_fallback_when_tokens_cross_a_turn_boundary() -> None:
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {ch: i for i, ch in enumerate(letters)} | {"bc": 26}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("b", "c")]))
    chat = ChatProcessor(tok, template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    doc = chat(msgs(("user", "ab"), ("assistant", "cd")))
    assert doc is not None
    assert tok.encode("abcd").ids == [0, 26, 3]  # the canonical form merges across turns
    assert doc["input_ids"].tolist() == [0, 1, 2, 3] and doc["loss_mask"].tolist() == [
        0, 0, 1, 1]
    assert chat.counts["per_piece"] == 1
    unchecked = ChatProcessor(tok, template="{% for m in messages %}{{ m['content'] }}"
                              "{% endfor %}", check_alignment=False)
    same = unchecked(msgs(("user", "ab"), ("assistant", "cd")))
    assert same is not None and same["input_ids"].tolist() == [0, 1, 2, 3]
    assert unchecked.counts["per_piece"] == 0  # the check only reports; output is the same


def test_prompt_datasets_and_metadata(tok: Tokenizer) -> None:
    chat = ChatProcessor(tok, input_key="prompt", label_key="response",
                         metadata_keys=("id", "answer"))
    with_response = chat({"prompt": "2+2?", "response": "4", "id": 7, "answer": "4"})
    prompt_only = chat({"prompt": "2+2?", "response": None, "id": 8})
    assert with_response is not None and prompt_only is not None
    ids, mask = expected_chatml(tok, msgs(("user", "2+2?"), ("assistant", "4")))
    assert with_response["input_ids"].tolist() == ids
    assert with_response["loss_mask"].tolist() == mask
    assert (with_response["id"], with_response["answer"]) == (7, "4")
    gen = tok.encode("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False).ids
    assert prompt_only["input_ids"].tolist() == gen and not prompt_only["loss_mask"].any()
    assert prompt_only["answer"] is None
    assert chat.columns() == ["prompt", "response", "id", "answer"]
    assert chat({"response": "x"}) is None and chat.counts["missing_field"] == 1
    with pytest.raises(ConfigError, match="label_key needs input_key"):
        ChatProcessor(tok, label_key="response")


def test_pickles_and_builds_record_chunks(tok: Tokenizer, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    chat = ChatProcessor(tok, max_length=64)
    clone = pickle.loads(pickle.dumps(chat))
    rec = CASES["multi_turn"]
    a, b = chat(rec), clone(rec)
    assert a is not None and b is not None and all((a[k] == b[k]).all() for k in a)
    assert repr(chat) == repr(clone)  # deterministic: it is part of the build fingerprint
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(CASES[c]) + "\n" for c in sorted(CASES)))
    summary = sw.build([src], tmp_path / "cache", processor=chat, vocab_size=chat.vocab_size(),
                       records=True, workers=1, progress=False)
    assert summary.documents == len(CASES)
    cache = sw.open_cache(tmp_path / "cache")
    rows = pq.read_table(cache.chunks[0].base.with_suffix(".parquet")).to_pylist()
    for row, case in zip(rows, sorted(CASES), strict=True):
        want = chat(CASES[case])
        assert want is not None
        assert row["labels"] == want["labels"].tolist()
        assert row["loss_mask"] == want["loss_mask"].tolist()


def test_build_counts_the_processors_own_reasons(tok: Tokenizer, tmp_path: Path) -> None:
    chat = ChatProcessor(tok, max_length=256, overflow="drop")
    src = tmp_path / "chats.jsonl"
    bad = {"messages": "not a list of messages"}
    long = msgs(("user", "word " * 400), ("assistant", "ok"))
    lines = [CASES["multi_turn"], bad, long, CASES["single_turn"]]
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ConfigError, match="records=True"):
        sw.build([src], tmp_path / "a", processor=chat, progress=False)
    summary = sw.build([src], tmp_path / "b", processor=chat, records=True, workers=2,
                       on_error="skip", progress=False)
    assert summary.documents == 2
    assert summary.errors == {"bad_messages": 1, "too_long": 1}
