"""Processors turn parsed records into documents.

A processor's ``settings()`` go into the manifest, so a cache is never silently reused
with another tokenizer or another function: :class:`TokenizerProcessor` records the
tokenizer's fingerprint (a hash of its serialised JSON); :class:`FunctionProcessor`
records the function's qualified name and a hash of its bytecode and constants.

``process(records)`` returns, per record, a token array (token chunks), a dict with at
least ``input_ids`` (record chunks), or an :class:`InputError` with a reason key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from shardwise.errors import ConfigError, InputError

Document = npt.NDArray[np.int64] | dict[str, Any]

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]",
                  "<EOS>", "<|im_end|>", "[SEP]")


class Processor(Protocol):
    def settings(self) -> dict[str, Any]: ...
    def columns(self) -> list[str] | None: ...
    def process(self, records: Sequence[dict[str, Any]]) -> list[Document | InputError]: ...


def _field_error(rec: dict[str, Any], key: str) -> InputError | None:
    if key not in rec or rec[key] is None:
        return InputError(f"missing field {key!r} (fields: {sorted(rec)[:10]})",
                          reason="missing_field")
    value = rec[key]
    if not isinstance(value, str):
        return InputError(f"field {key!r} is {type(value).__name__}, expected a string",
                          reason="not_string")
    if not value.strip():
        return InputError(f"field {key!r} is empty", reason="empty_text")
    return None


@dataclass
class TokenizerProcessor:
    """Tokenizes ``record[text_key]`` with a ``tokenizers`` Tokenizer, in batches.

    ``append_eod`` appends ``eod_id`` to each document (Megatron's ``--append-eod``).
    The tokenizer is loaded lazily in each worker process from its JSON.
    """

    tokenizer_json: str
    text_key: str = "text"
    append_eod: bool = False
    eod_id: int | None = None
    add_special_tokens: bool = False

    def __post_init__(self) -> None:
        self._tok: Any = None
        if self.append_eod and self.eod_id is None:
            raise ConfigError("append_eod needs an end-of-document id; the tokenizer has none "
                              f"of {list(EOD_CANDIDATES)}: pass eod_token=... or eod_id=...")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, text_key: str = "text",
                  append_eod: bool = False, eod_token: str | None = None,
                  add_special_tokens: bool = False) -> TokenizerProcessor:
        from tokenizers import Tokenizer

        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"tokenizer file {p} does not exist; pass a tokenizer.json "
                              "saved by the tokenizers library")
        text = p.read_text(encoding="utf-8")
        tok = Tokenizer.from_str(text)
        eod_id = find_eod(tok, eod_token)
        return cls(text, text_key=text_key, append_eod=append_eod, eod_id=eod_id,
                   add_special_tokens=add_special_tokens)

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_str(self.tokenizer_json)
        return self._tok

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tok"] = None
        return state

    def fingerprint(self) -> str:
        return xxhash.xxh3_128_hexdigest(self.tokenizer.to_str().encode())

    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def settings(self) -> dict[str, Any]:
        return {"kind": "tokenizer", "text_key": self.text_key, "append_eod": self.append_eod,
                "add_special_tokens": self.add_special_tokens}

    def columns(self) -> list[str] | None:
        return [self.text_key]

    def process(self, records: Sequence[dict[str, Any]]) -> list[Document | InputError]:
        out: list[Document | InputError] = []
        texts, slots = [], []
        for rec in records:
            err = _field_error(rec, self.text_key)
            out.append(err)  # type: ignore[arg-type]
            if err is None:
                slots.append(len(out) - 1)
                texts.append(rec[self.text_key])
        if texts:
            tok = self.tokenizer
            encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
            encs = encode(texts, add_special_tokens=self.add_special_tokens)
            eod = [self.eod_id] if self.append_eod else []
            for slot, enc in zip(slots, encs, strict=True):
                out[slot] = np.array(enc.ids + eod, dtype=np.int64)
        return out


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
