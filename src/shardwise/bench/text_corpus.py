"""The text corpus the build and stream benches tokenize: the bundled sample (or a given
JSONL file) repeated to a size, each copy marked so no two documents are equal.

Why its own module: two benches build from the same corpus, and "what was measured" is
part of every figure's meaning; the corpus is written once here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardwise.errors import ConfigError

MB = 1_000_000


@dataclass(frozen=True)
class Corpus:
    """The JSONL file the bench builds, and what it holds."""

    path: Path
    documents: int
    text_bytes: int
    file_bytes: int
    copies: int


def sample_dir() -> Path | None:
    """The bundled sample (``shardwise/bench/sample/``: package data, so a wheel has it; the
    repository's ``sample/`` is a link to it), if this install has it."""
    d = Path(__file__).resolve().parent / "sample"
    return d if (d / "corpus.jsonl").is_file() and (d / "tokenizer.json").is_file() else None


def resolve_inputs(corpus: str | None, tokenizer: str | None) -> tuple[Path, Path]:
    """The corpus and tokenizer files: the ones given, else the bundled sample's."""
    sample = sample_dir()
    if sample is None and (corpus is None or tokenizer is None):
        missing = " and ".join(f"--{n} FILE" for n, v in (("corpus", corpus),
                                                           ("tokenizer", tokenizer)) if v is None)
        raise ConfigError("the bundled sample (shardwise/bench/sample/corpus.jsonl and "
                          "tokenizer.json, package data) is missing from this install; pass "
                          f"{missing} (a JSONL file with a 'text' field, a tokenizer.json)")
    paths = (Path(corpus) if corpus else Path(sample or ".", "corpus.jsonl"),
             Path(tokenizer) if tokenizer else Path(sample or ".", "tokenizer.json"))
    for what, p in zip(("corpus", "tokenizer"), paths, strict=True):
        if not p.is_file():
            raise ConfigError(f"{what} file {p} does not exist")
    return paths


def read_texts(path: Path, limit_bytes: int) -> list[str]:
    """The ``text`` fields of a JSONL file, stopping once ``limit_bytes`` of text are read."""
    import orjson

    texts: list[str] = []
    total = 0
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = orjson.loads(line)["text"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{path}:{n}: expected a JSON object with a string 'text' "
                                  f"field ({type(e).__name__}: {e})") from None
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"{path}:{n}: 'text' must be a non-empty string")
            texts.append(text)
            total += len(text.encode("utf-8"))
            if total >= limit_bytes:
                break
    if not texts:
        raise ConfigError(f"{path}: no records with a 'text' field")
    return texts


def make_corpus(texts: list[str], mb: float, out: Path) -> Corpus:
    """Write ``texts`` repeated (``[copy k]`` marks each copy) until ``mb`` MB of text."""
    import orjson

    target = max(1, int(mb * MB))
    docs = text_bytes = copy = 0
    with open(out, "wb") as f:
        while text_bytes < target:
            for t in texts:
                text = f"[copy {copy}] {t}"
                f.write(orjson.dumps({"id": docs, "text": text}) + b"\n")
                docs += 1
                text_bytes += len(text.encode("utf-8"))
                if text_bytes >= target:
                    break
            copy += 1
    return Corpus(out, docs, text_bytes, out.stat().st_size, copy)


__all__ = ["MB", "Corpus", "make_corpus", "read_texts", "resolve_inputs", "sample_dir"]
