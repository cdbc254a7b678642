"""Chat / SFT records → ``input_ids``, ``labels`` and ``loss_mask``, loss on assistant turns.

Why: SFT trains only on what the assistant says; the prompt, system and user turns are
context. The mask must line up with the tokens exactly, for any chat template, without
``transformers`` and without running code from the data.

How. The conversation is rendered with a Jinja chat template in a sandbox
(:mod:`shardwise.writer.chat_template`: where templates come from and what they may do).

Spans are found by *incremental rendering*: ``P_k`` renders the first ``k`` messages,
``G_i`` renders the first ``i`` with ``add_generation_prompt=True``. Message ``i`` adds
``P_{i+1}[len(P_i):]``; if it is a trained (assistant) turn, its loss starts where ``G_i``
and ``P_{i+1}`` part (the generation prompt is context) and runs to the end of the turn,
end-of-turn tokens included (the model must learn to stop). With the built-in template::

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
    `------------- P_1 ------------'`------ G_1 ------------'
                                                           `-- trained ---------'

A template whose renders are not prefixes of each other (one that rewrites earlier turns)
yields an :class:`InputError` ``template_not_incremental``.

Token alignment: the pieces (untrained/trained runs of text) are tokenized one by one and
the full text once; if the concatenated piece ids equal the full tokenization (the usual
case: turn boundaries fall on special tokens or pre-tokenizer splits), the result is
exactly the canonical tokenization. If not, the per-piece tokenization is kept (its mask
is exact; it is a valid but non-canonical tokenization) and ``counts["per_piece"]`` says
so. The check costs a second tokenization and never changes the output:
``check_alignment=False`` skips it. Rendering costs O(turns²) per conversation;
tokenization is batched per call.

Prompt datasets (``input_key``): a record ``{prompt, response?}`` becomes a user turn and,
when present, an assistant turn; a prompt without a response ends with the generation
prompt and has no trained token (RL prompts).

Rejections are :class:`InputError` values with a reason: ``missing_field``,
``bad_messages``, ``template_error``, ``template_not_incremental``, ``too_long``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from shardwise.checkpoint import as_count
from shardwise.choice import Choice
from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError, InputError
from shardwise.format.chunk import IGNORE_INDEX
from shardwise.writer.chat_template import compile_template, load_template
from shardwise.writer.processors import Document, find_eod, load_tokenizer, parse_tokenizer


class Overflow(Choice):
    """What to do with a record longer than ``max_length`` tokens."""

    __option__ = "overflow"
    TRUNCATE = "truncate"
    DROP = "drop"


@dataclass(frozen=True)
class ChatConfig:
    """Options of a :class:`ChatProcessor` (all of them go into the cache's manifest)."""

    messages_key: str = "messages"
    input_key: str | None = None
    label_key: str | None = None
    metadata_keys: tuple[str, ...] = ()
    max_length: int | None = None
    overflow: Overflow = Overflow.TRUNCATE
    train_on: tuple[str, ...] = ("assistant",)
    bos_token: str | None = None
    eos_token: str | None = None
    template_vars: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_length is not None:  # None: no limit
            object.__setattr__(self, "max_length", as_count(self.max_length, "max_length",
                                                            minimum=1, error=ConfigError))
        if self.label_key is not None and self.input_key is None:
            raise ConfigError("label_key needs input_key (the prompt field of the record)")
        if not self.train_on or not all(isinstance(r, str) for r in self.train_on):
            raise ConfigError(f"train_on must be a non-empty tuple of role names, "
                              f"got {self.train_on!r}")
        try:
            json.dumps(dict(self.template_vars))
        except TypeError as e:
            raise ConfigError(f"template_vars must be plain JSON values: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"messages_key": self.messages_key, "input_key": self.input_key,
                "label_key": self.label_key, "metadata_keys": list(self.metadata_keys),
                "max_length": self.max_length, "overflow": self.overflow.value,
                "train_on": list(self.train_on), "bos_token": self.bos_token,
                "eos_token": self.eos_token, "template_vars": dict(self.template_vars)}


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return n if a[:n] == b[:n] else next(i for i in range(n) if a[i] != b[i])


class ChatProcessor:
    """Conversations (or prompt/response records) → ``input_ids``, ``labels``, ``loss_mask``.

    A build :class:`~shardwise.writer.processors.Processor` (``settings``, ``columns``,
    ``process``) and a ``map_fn`` (``processor(record) -> dict | None``). Picklable: the
    tokenizer travels as JSON and the template as text, both rebuilt lazily per process.

    >>> chat = ChatProcessor("tokenizer.json", max_length=2048)          # doctest: +SKIP
    >>> chat({"messages": [{"role": "user", "content": "Hi"},             # doctest: +SKIP
    ...                    {"role": "assistant", "content": "Hello"}]})["loss_mask"]
    array([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1], dtype=int8)

    ``counts`` (this process only): ``truncated``, ``per_piece`` and each rejection reason.
    """

    records = True  # makes dicts: build with records=True (Parquet chunks)

    def __init__(self, tokenizer: Any, *, template: str | os.PathLike[str] | None = None,
                 messages_key: str = "messages", max_length: int | None = None,
                 overflow: str | Overflow = Overflow.TRUNCATE,
                 train_on: Sequence[str] = ("assistant",), input_key: str | None = None,
                 label_key: str | None = None, metadata_keys: Sequence[str] = (),
                 bos_token: str | None = None, eos_token: str | None = None,
                 template_vars: Mapping[str, Any] | None = None,
                 check_alignment: bool = True) -> None:
        self.config = ChatConfig(messages_key, input_key, label_key, tuple(metadata_keys),
                                 max_length, Overflow.parse(overflow), tuple(train_on),
                                 bos_token, eos_token, dict(template_vars or {}))
        loaded = load_tokenizer(tokenizer)  # truncation and padding off, as every build
        self.tokenizer_json, self.switched_off = loaded.json, loaded.switched_off
        self.template_source = load_template(template)
        self.check_alignment = check_alignment
        # parsed once per process (.local): a pickled processor carries the sources only
        self._tok: ProcessLocal[Any] = ProcessLocal(self._parse_tokenizer, name="tokenizer")
        self._template: ProcessLocal[Any] = ProcessLocal(self._compile, name="template")
        self.counts: Counter[str] = Counter()
        self._probe()

    # -- identity -----------------------------------------------------------------------
    def __repr__(self) -> str:  # deterministic: FunctionProcessor fingerprints it
        return (f"ChatProcessor(template={self.template_sha()}, "
                f"tokenizer={self.fingerprint()}, {self.config.to_dict()})")

    def template_sha(self) -> str:
        return hashlib.sha256(self.template_source.encode()).hexdigest()[:16]

    def fingerprint(self) -> str:
        return xxhash.xxh3_128_hexdigest(self.tokenizer_json.encode())

    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def eod_id(self) -> int | None:
        return find_eod(self.tokenizer, self.config.eos_token)

    def settings(self) -> dict[str, Any]:
        out = {"kind": "chat", "template_sha256": self.template_sha(), **self.config.to_dict()}
        if self.switched_off:  # only then: caches built before keep their identity
            out["switched_off"] = self.switched_off
        return out

    def columns(self) -> list[str] | None:
        c = self.config
        keys = [c.messages_key] if c.input_key is None else [c.input_key]
        keys += [c.label_key] if c.label_key else []
        return keys + [k for k in c.metadata_keys if k not in keys]

    @property
    def tokenizer(self) -> Any:
        return self._tok.get()

    @property
    def template(self) -> Any:
        return self._template.get()

    def _parse_tokenizer(self) -> Any:
        return parse_tokenizer(self.tokenizer_json)

    def _compile(self) -> Any:
        return compile_template(self.template_source)

    def _probe(self) -> None:
        """Render a minimal conversation now, so a broken template fails at construction."""
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        try:
            self._render(probe, False)
            self._render(probe[:1], True)
        except InputError as e:
            raise ConfigError(f"the chat template cannot render a user/assistant exchange: "
                              f"{e}") from None

    # -- rendering ------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        from jinja2.exceptions import SecurityError, TemplateError

        c = self.config
        try:
            return str(self.template.render(
                **c.template_vars, messages=messages, add_generation_prompt=generation_prompt,
                bos_token=c.bos_token or "", eos_token=c.eos_token or ""))
        except SecurityError as e:
            raise ConfigError(f"the chat template violates the sandbox: {e}") from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
            raise InputError(f"chat template failed: {type(e).__name__}: {e}",
                             reason="template_error") from None

    def _messages(self, rec: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        """The conversation and whether it ends with a generation prompt."""
        c = self.config
        if c.input_key is not None:
            prompt = rec.get(c.input_key)
            if not isinstance(prompt, str):
                raise InputError(f"field {c.input_key!r} is "
                                 f"{'missing' if prompt is None else type(prompt).__name__}"
                                 ", expected a string", reason="missing_field")
            msgs = [{"role": "user", "content": prompt}]
            response = rec.get(c.label_key) if c.label_key else None
            if response is None:
                return msgs, True
            if not isinstance(response, str):
                raise InputError(f"field {c.label_key!r} is {type(response).__name__}, "
                                 "expected a string", reason="bad_messages")
            return msgs + [{"role": "assistant", "content": response}], False
        if rec.get(c.messages_key) is None:
            raise InputError(f"missing field {c.messages_key!r} (fields: {sorted(rec)[:10]})",
                             reason="missing_field")
        return _check_messages(rec[c.messages_key], c.messages_key), False

    def pieces(self, rec: dict[str, Any]) -> list[tuple[str, bool]]:
        """The rendered text as ``(text, trained)`` runs, in order (see the module doc)."""
        msgs, gen = self._messages(rec)
        try:
            prev = self._render([], False)
        except InputError:
            prev = ""
        out: list[tuple[str, bool]] = [(prev, False)]  # e.g. a BOS before any message
        for i, msg in enumerate(msgs):
            cur = self._render(msgs[: i + 1], False)
            if not cur.startswith(prev):
                raise InputError(f"the template renders messages[:{i + 1}] without the "
                                 f"render of messages[:{i}] as its prefix, so turns cannot "
                                 "be located", reason="template_not_incremental")
            start, trained = len(prev), msg["role"] in self.config.train_on
            if trained and msg["role"] == "assistant":
                with suppress(InputError):  # the generation prompt is context, not a target
                    start = max(start, _common_prefix(self._render(msgs[:i], True), cur))
            out += [(cur[len(prev):start], False), (cur[start:], trained)]
            prev = cur
        if gen:
            full = self._render(msgs, True)
            out.append((full[len(prev):], False))
        return [(t, m) for t, m in out if t]

    # -- processing -----------------------------------------------------------------------
    def process(self, records: Sequence[dict[str, Any]]) -> list[Document | InputError]:
        """One document (or :class:`InputError`) per record, in order."""
        parts: list[list[tuple[str, bool]] | InputError] = []
        texts: list[str] = []
        for rec in records:
            try:
                runs = self.pieces(rec)
            except InputError as e:
                parts.append(e)
                continue
            parts.append(runs)
            texts += [t for t, _ in runs]
            if self.check_alignment:
                texts.append("".join(t for t, _ in runs))
        encs = iter(self.tokenizer.encode_batch(texts, add_special_tokens=False)
                    if texts else [])
        out: list[Document | InputError] = []
        for rec, p in zip(records, parts, strict=True):
            if isinstance(p, InputError):
                out.append(p)
                continue
            ids = [next(encs).ids for _ in p]
            full = next(encs).ids if self.check_alignment else None
            out.append(self._document(rec, p, ids, full))
        return out

    def _document(self, rec: dict[str, Any], parts: list[tuple[str, bool]],
                  ids: list[list[int]], full: list[int] | None) -> Document | InputError:
        flat = [t for piece in ids for t in piece]
        if full is not None and flat != full:
            self.counts["per_piece"] += 1
        mask = np.concatenate([np.full(len(piece), trained, dtype=np.int8)
                               for piece, (_, trained) in zip(ids, parts, strict=True)]
                              + [np.zeros(0, np.int8)])
        input_ids = np.asarray(flat, dtype=np.int64)
        c = self.config
        if c.max_length is not None and len(input_ids) > c.max_length:
            if c.overflow is Overflow.DROP:
                return InputError(f"{len(input_ids)} tokens, more than max_length="
                                  f"{c.max_length}", reason="too_long")
            if mask.any() and not mask[: c.max_length].any():
                return InputError(f"truncating {len(input_ids)} tokens to max_length="
                                  f"{c.max_length} leaves no trained token", reason="too_long")
            self.counts["truncated"] += 1
            input_ids, mask = input_ids[: c.max_length], mask[: c.max_length]
        doc: dict[str, Any] = {"input_ids": input_ids,
                               "labels": np.where(mask == 1, input_ids, IGNORE_INDEX),
                               "loss_mask": mask}
        for key in c.metadata_keys:
            doc[key] = rec.get(key)
        return doc

    def __call__(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """``map_fn`` form: the document, or None for a rejected record (counted by reason
        in ``counts``)."""
        value = self.process([record])[0]
        if isinstance(value, InputError):
            self.counts[value.reason] += 1
            return None
        return value  # type: ignore[return-value]


def _check_messages(value: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InputError(f"field {key!r} must be a non-empty list of messages, got "
                         f"{type(value).__name__}", reason="bad_messages")
    for i, m in enumerate(value):
        ok = (isinstance(m, dict) and isinstance(m.get("role"), str)
              and (m.get("content") is None or isinstance(m.get("content"), str)))
        if not ok:
            raise InputError(f"{key}[{i}] must be a dict with a string 'role' and a string "
                             f"(or null) 'content', got {str(m)[:80]!r}", reason="bad_messages")
    return value


__all__ = ["ChatConfig", "ChatProcessor", "Overflow"]
