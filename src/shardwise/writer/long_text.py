"""Encoding a huge text in bounded memory, with exactly the ids of encoding it whole.

Why: ``tokenizers`` holds a whole Encoding (ids, offsets, token strings, words) and its
pre-tokenization while it encodes, about 650 bytes per token: one 100 MB record (27 M
tokens) took 12 GB, and every rerun of the build died at the same record.

How: a text of more than ``SPLIT_CHARS`` characters is encoded window by window. A window
starts where the previous one was cut, is encoded once, and is cut at the start of a
pre-token near ``PIECE_CHARS``; the cut is kept only if two exact comparisons of ids
pass::

    text     ..lo ─────────────────── b ──────── c ──────────── hi..
    E        encode(text[lo:hi])        tokens e0 ...   | ek ... en
    check 1  encode(text[c:hi])  == E[k:]     a fresh start at c changes nothing
    check 2  encode(text[b:c])   == E[kb:k]   ending the text at c changes nothing
             (both E[kb:k] and E[k:] hold tokens, so that an effect at a check's far
             end, such as a Strip normalizer removing trailing whitespace, cannot
             reach c)
    keep     E[:k] as the ids of text[lo:c]; the next window starts at c

The model (BPE, WordPiece, Unigram, WordLevel) encodes each pre-token on its own, so a
cut between pre-tokens cannot change what it does; the checks cover what runs around the
model and can see across a cut: a normalizer that strips or prepends, a pre-tokenizer
that adds a prefix space, a split regex's look-ahead, an added token, a post-processor
that adds special tokens. Each check encodes ``MARGIN_CHARS`` of context (a few percent
of the work). A window starts only at a checked cut, so a split regex is in step with the
whole text there (``\\p{N}{1,3}`` groups digits from where it starts).

The rule for refusing (an :class:`~shardwise.errors.InputError`, reason
``unsplittable``; the build names the record's file and line, or counts it with
``on_error='skip'``), never a guess and never an out-of-memory kill:

- the tokenizer has no pre-tokenizer: its model sees the whole text as one word, and
  BPE merges can reach across any cut;
- special tokens are asked for (``add_special_tokens``) and the tokenizer has a
  post-processor: it would add them around every piece;
- no cut near the end of a window passes the checks within ``MAX_TRIES`` pre-tokens,
  e.g. one pre-token longer than about ``PIECE_CHARS / 2`` characters (a run of letters
  without a space or punctuation), or a normalizer that changes the text at every cut.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shardwise.errors import InputError

SPLIT_CHARS = 1 << 20
"""Texts up to this many characters are encoded whole (every ordinary record)."""
PIECE_CHARS = 1 << 18
"""About this many characters per window: ~70 k tokens, ~50 MB while encoding."""
MARGIN_CHARS = 1 << 12
"""Characters of context each check encodes on its side of a cut."""
MAX_TRIES = 16
"""Candidate cuts (pre-token starts, backwards from ``PIECE_CHARS``) tried per window."""


def encode_long(tok: Any, text: str, *, add_special_tokens: bool = False
                ) -> npt.NDArray[np.uint32] | InputError:
    """The ids of ``tok.encode(text)``, computed window by window (see the module doc)."""
    if tok.pre_tokenizer is None:
        return _refuse(text, "the tokenizer has no pre-tokenizer, so no place in the text "
                             "is known where cutting it leaves the tokens unchanged")
    if add_special_tokens and tok.post_processor is not None:
        return _refuse(text, "special tokens are asked for and the tokenizer's "
                             "post-processor would add them around every piece")
    parts: list[npt.NDArray[np.uint32]] = []
    lo = 0
    while True:
        hi = min(len(text), lo + PIECE_CHARS + MARGIN_CHARS)
        enc = tok.encode(text[lo:hi], add_special_tokens=add_special_tokens)
        ids = enc.ids
        if hi == len(text):
            parts.append(np.asarray(ids, dtype=np.uint32))
            return np.concatenate(parts)
        cut = _checked_cut(tok, text, lo, hi, enc, ids, add_special_tokens)
        if cut is None:
            return _refuse(text, f"no cut between characters {lo + PIECE_CHARS // 4:,} and "
                                 f"{lo + PIECE_CHARS:,} leaves the tokens unchanged (a "
                                 "pre-token that long, or a normalizer that changes the "
                                 "text at every cut)")
        k, c = cut
        parts.append(np.asarray(ids[:k], dtype=np.uint32))
        lo += c


def _refuse(text: str, why: str) -> InputError:
    return InputError(f"a text of {len(text):,} characters is too long to encode at once "
                      f"(more than {SPLIT_CHARS:,}) and cannot be encoded in pieces: {why}; "
                      "split the record at its source, or skip it with on_error='skip'",
                      reason="unsplittable")


def _checked_cut(tok: Any, text: str, lo: int, hi: int, enc: Any, ids: list[int],
                 add: bool) -> tuple[int, int] | None:
    """``(k, c)``: cut the window before token ``k``, at character ``lo + c``, or None."""
    x = PIECE_CHARS
    for _ in range(MAX_TRIES):
        k, c = _cut_before(enc, len(ids), x)
        if c < PIECE_CHARS // 4:
            return None
        kb, b = _cut_before(enc, len(ids), max(0, c - MARGIN_CHARS))
        # each side must hold tokens: an effect at a check's far end (a Strip normalizer
        # removing a trailing run of whitespace) then cannot reach the cut
        if kb < k < len(ids):
            right = tok.encode(text[lo + c:hi], add_special_tokens=add).ids
            if right == ids[k:]:
                left = tok.encode(text[lo + b:lo + c], add_special_tokens=add).ids
                if left == ids[kb:k]:
                    return k, c
        x = c - 1
    return None


def _cut_before(enc: Any, n: int, x: int) -> tuple[int, int]:
    """The last cut at or before character ``x`` between two pre-tokens (or where no
    token covers the text): ``(k, c)``, tokens ``[0, k)`` end at or before ``c``."""
    k = _tokens_starting_before(enc, n, x)
    if k > 0 and (enc.token_to_chars(k - 1)[1] > x or (k < n and _same_word(enc, k))):
        k = _first_of_word(enc, k - 1)  # x is inside a pre-token: cut before it
        if k == 0:
            return 0, 0
    return k, (x if k == 0 else min(x, enc.token_to_chars(k - 1)[1]))


def _tokens_starting_before(enc: Any, n: int, x: int) -> int:
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if enc.token_to_chars(mid)[0] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _same_word(enc: Any, k: int) -> bool:
    """Token ``k`` continues token ``k - 1``'s pre-token (same word, nothing between)."""
    w = enc.token_to_word(k)
    return (w is not None and w == enc.token_to_word(k - 1)
            and enc.token_to_chars(k - 1)[1] == enc.token_to_chars(k)[0])


def _first_of_word(enc: Any, k: int) -> int:
    w = enc.token_to_word(k)
    span = None if w is None else enc.word_to_tokens(w)
    return k if span is None else int(span[0])
