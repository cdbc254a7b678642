"""Processors turn parsed records into documents.

A processor's ``settings()`` go into the manifest, so a cache is never silently reused
with another tokenizer or another function: :class:`TokenizerProcessor` records the
tokenizer's fingerprint (a hash of its serialised JSON); :class:`FunctionProcessor`
records the function's qualified name and a hash of its bytecode and constants.

``process(records)`` returns, per record, a token array (token chunks), a dict with at
least ``input_ids`` (record chunks), or an :class:`InputError` with a reason key.

Every tokenizer is loaded by :func:`load_tokenizer`, which switches off truncation and
padding: a tokenizer.json saved from an embedding or classifier model often has them on,
and a build must store every token of every document (1 MB of Python source once became 47
documents of exactly 128 tokens). What was switched off is recorded in the manifest's
processor settings (``switched_off``) and said once in the build summary.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from shardwise.concurrency.local import ProcessLocal
from shardwise.errors import ConfigError, InputError
from shardwise.sources.fields import MISSING, lookup
from shardwise.writer import long_text

Document = npt.NDArray[np.integer[Any]] | dict[str, Any]

ENCODE_CHARS = 1 << 18
"""Characters per ``encode_batch`` call: the tokenizer holds ~650 bytes per token while it
encodes, so a batch is bounded by its text, not only by its number of records."""

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]",
                  "<EOS>", "<|im_end|>", "[SEP]")


class Processor(Protocol):
    def settings(self) -> dict[str, Any]: ...
    def columns(self) -> list[str] | None: ...
    def process(self, records: Sequence[dict[str, Any]]) -> list[Document | InputError]: ...


def _text(rec: dict[str, Any], key: str) -> str | InputError:
    """``rec``'s text at ``key`` (``meta.body``: a nested field, :mod:`~shardwise.sources.
    fields`), or why there is none. An empty text is a text: it becomes a document of zero
    tokens (Megatron's preprocessing keeps it too)."""
    value, why = lookup(rec, key)
    if value is MISSING or value is None:
        why = why or f"fields: {sorted(rec)[:10]}"
        return InputError(f"missing field {key!r} ({why})", reason="missing_field")
    if not isinstance(value, str):
        return InputError(f"field {key!r} is {type(value).__name__}, expected a string",
                          reason="not_string")
    return value


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer's JSON with truncation and padding off, and what was on before.

    ``json`` is the source text unchanged when nothing was switched off (so a cache's
    tokenizer fingerprint does not change), else the re-serialised tokenizer."""

    json: str
    switched_off: dict[str, Any]


def tokenizer_source_json(tokenizer: Any) -> str:
    """The JSON of a ``tokenizers.Tokenizer`` or of a tokenizer.json path."""
    if hasattr(tokenizer, "to_str"):
        return str(tokenizer.to_str())
    if isinstance(tokenizer, str | os.PathLike):
        path = Path(tokenizer)
        if not path.is_file():
            raise ConfigError(f"tokenizer file {path} does not exist; pass a tokenizer.json "
                              "saved by the tokenizers library or a tokenizers.Tokenizer")
        return path.read_text(encoding="utf-8")
    raise ConfigError(f"tokenizer must be a tokenizers.Tokenizer or a path to tokenizer.json, "
                      f"got {type(tokenizer).__name__}")


def load_tokenizer(tokenizer: Any) -> LoadedTokenizer:
    """Load a tokenizer (path, JSON text or ``tokenizers.Tokenizer``; the object is not
    changed) with truncation and padding switched off; see the module docstring."""
    text = tokenizer if _is_json(tokenizer) else tokenizer_source_json(tokenizer)
    tok = _parse(text)
    switched_off = {name: dict(value) for name, value in
                    (("truncation", tok.truncation), ("padding", tok.padding)) if value}
    if not switched_off:
        return LoadedTokenizer(text, {})
    tok.no_truncation()
    tok.no_padding()
    return LoadedTokenizer(tok.to_str(), switched_off)


def parse_tokenizer(text: str) -> Any:
    """A ``tokenizers.Tokenizer`` from the JSON :func:`load_tokenizer` returned (every
    processor rebuilds its tokenizer so in each worker), never truncating or padding."""
    tok = _parse(text)
    if tok.truncation or tok.padding:
        tok.no_truncation()
        tok.no_padding()
    return tok


def _is_json(value: Any) -> bool:
    return isinstance(value, str) and value.lstrip().startswith("{")


def _parse(text: str) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise ConfigError(f"not a tokenizer.json the tokenizers library can load: {e}"
                          ) from None


def switched_off_notes(switched_off: dict[str, Any]) -> list[str]:
    """The build summary's one line about :attr:`LoadedTokenizer.switched_off`."""
    if not switched_off:
        return []
    parts = []
    if "truncation" in switched_off:
        parts.append(f"truncation (max_length {switched_off['truncation'].get('max_length')})")
    if "padding" in switched_off:
        parts.append("padding")
    it = "they were" if len(parts) > 1 else "it was"
    return [f"the tokenizer had {' and '.join(parts)} switched on; a build never truncates or "
            f"pads, so {it} switched off (recorded in the manifest)"]


@dataclass
class TokenizerProcessor:
    """Tokenizes ``record[text_key]`` with a ``tokenizers`` Tokenizer, in batches.

    ``append_eod`` appends ``eod_id`` to each document (Megatron's ``--append-eod``).
    The tokenizer is loaded lazily in each worker process from its JSON, with truncation
    and padding off (:func:`load_tokenizer`). A text of more than ``SPLIT_CHARS``
    characters is encoded in pieces (:mod:`shardwise.writer.long_text`), with the ids of
    encoding it whole, or refused as ``unsplittable``.
    """

    tokenizer_json: str
    text_key: str = "text"
    append_eod: bool = False
    eod_id: int | None = None
    add_special_tokens: bool = False
    switched_off: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        loaded = load_tokenizer(self.tokenizer_json)
        self.tokenizer_json = loaded.json
        # parsed once per process (.local): a pickled processor (a build worker's) carries
        # the JSON only, and a forked child does not use a parent's Rust tokenizer
        self._tok: ProcessLocal[Any] = ProcessLocal(self._parse, name="tokenizer")
        self.switched_off = {**self.switched_off, **loaded.switched_off}
        if self.append_eod and self.eod_id is None:
            raise ConfigError("append_eod needs an end-of-document id; the tokenizer has none "
                              f"of {list(EOD_CANDIDATES)}: pass eod_token=... or eod_id=...")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | Any, *, text_key: str = "text",
                  append_eod: bool = False, eod_token: str | None = None,
                  add_special_tokens: bool = False) -> TokenizerProcessor:
        """From a tokenizer.json path or a ``tokenizers.Tokenizer`` (left unchanged)."""
        loaded = load_tokenizer(path)
        eod_id = find_eod(parse_tokenizer(loaded.json), eod_token)
        return cls(loaded.json, text_key=text_key, append_eod=append_eod, eod_id=eod_id,
                   add_special_tokens=add_special_tokens, switched_off=loaded.switched_off)

    @property
    def tokenizer(self) -> Any:
        return self._tok.get()

    def _parse(self) -> Any:
        return parse_tokenizer(self.tokenizer_json)

    def fingerprint(self) -> str:
        return xxhash.xxh3_128_hexdigest(self.tokenizer.to_str().encode())

    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def settings(self) -> dict[str, Any]:
        out = {"kind": "tokenizer", "text_key": self.text_key, "append_eod": self.append_eod,
               "add_special_tokens": self.add_special_tokens}
        if self.switched_off:  # only then: caches built before keep their identity
            out["switched_off"] = self.switched_off
        return out

    def columns(self) -> list[str] | None:
        return [self.text_key]

    def process(self, records: Sequence[dict[str, Any]]) -> list[Document | InputError]:
        """Token ids (uint32, as the tokenizer gives them) per record, in encode calls of
        at most ``ENCODE_CHARS`` characters; a huge text alone, in pieces."""
        out: list[Document | InputError | None] = [None] * len(records)
        texts: list[str] = []
        slots: list[int] = []
        chars = 0
        for i, rec in enumerate(records):
            text = _text(rec, self.text_key)
            if isinstance(text, InputError):
                out[i] = text
                continue
            if len(text) > long_text.SPLIT_CHARS:
                ids = long_text.encode_long(self.tokenizer, text,
                                            add_special_tokens=self.add_special_tokens)
                out[i] = ids if isinstance(ids, InputError) else self._document(ids)
            else:
                texts.append(text)
                slots.append(i)
                chars += len(text)
                if chars >= ENCODE_CHARS:
                    self._encode_into(out, texts, slots)
                    texts, slots, chars = [], [], 0
        self._encode_into(out, texts, slots)
        return out  # type: ignore[return-value]  # every slot is filled

    def _encode_into(self, out: list[Any], texts: list[str], slots: list[int]) -> None:
        if not texts:
            return
        tok = self.tokenizer
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        encs = encode(texts, add_special_tokens=self.add_special_tokens)
        for slot, enc in zip(slots, encs, strict=True):
            out[slot] = self._document(enc.ids)

    def _document(self, ids: Sequence[int] | npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        n = len(ids)
        doc = np.empty(n + self.appended_tokens, dtype=np.uint32)
        doc[:n] = ids
        if self.append_eod and self.eod_id is not None:  # never None: see __post_init__
            doc[n] = self.eod_id
        return doc

    @property
    def appended_tokens(self) -> int:
        """Tokens added to every document (the end-of-document id): a document of exactly
        this many tokens is an empty one."""
        return 1 if self.append_eod else 0


def find_eod(tok: Any, eod_token: str | None) -> int | None:
    """The id of ``eod_token``, or of the first well-known end-of-text token present."""
    if eod_token is not None:
        tid = tok.token_to_id(eod_token)
        if tid is None:
            raise ConfigError(f"eod token {eod_token!r} is not in the tokenizer's vocabulary")
        return int(tid)
    for cand in EOD_CANDIDATES:
        tid = tok.token_to_id(cand)
        if tid is not None:
            return int(tid)
    return None


def function_fingerprint(fn: Callable[..., Any]) -> str:
    """Qualified name + hash of the bytecode and constants: changes when the code does."""
    code = getattr(fn, "__code__", None)
    h = hashlib.sha256(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', fn)}"
                       .encode())
    if code is not None:
        h.update(code.co_code)
        h.update(repr(code.co_consts).encode())
    return h.hexdigest()[:16]


@dataclass
class FunctionProcessor:
    """Any picklable callable ``fn(record) -> token ids | dict | None``; None rejects the
    record (counted as ``rejected``). ``vocab_size`` fixes the token dtype."""

    fn: Callable[[dict[str, Any]], Any]
    vocab_size_: int
    version: str | None = None
    records: bool = False

    def fingerprint(self) -> str:
        return self.version or function_fingerprint(self.fn)

    def vocab_size(self) -> int:
        return self.vocab_size_

    def settings(self) -> dict[str, Any]:
        return {"kind": "function", "records": self.records,
                "function": f"{getattr(self.fn, '__module__', '')}."
                            f"{getattr(self.fn, '__qualname__', repr(self.fn))}"}

    def columns(self) -> list[str] | None:
        return None

    def process(self, records: Sequence[dict[str, Any]]) -> list[Document | InputError]:
        out: list[Document | InputError] = []
        for rec in records:
            try:
                value = self.fn(rec)
            except Exception as e:  # the user's function: report, with file and line
                out.append(InputError(f"processor raised {type(e).__name__}: {e}",
                                      reason="processor_error"))
                continue
            out.append(self._coerce(value))
        return out

    def _coerce(self, value: Any) -> Document | InputError:
        if value is None:
            return InputError("processor rejected the record", reason="rejected")
        if isinstance(value, dict):
            if not self.records:
                raise ConfigError("the processor returned a dict; build with records=True to "
                                  "store dicts in Parquet chunks, or return token ids")
            if "input_ids" not in value:
                raise ConfigError(f"the processor returned a dict without 'input_ids' "
                                  f"(keys: {sorted(value)})")
            return value
        if self.records:
            return {"input_ids": np.asarray(value, dtype=np.int64)}
        return np.asarray(value, dtype=np.int64)
