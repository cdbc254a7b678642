"""Regenerate the bundled sample: sample/corpus.jsonl and sample/tokenizer.json.

The corpus is the docstrings of Python's standard library (real English prose and code
under the PSF licence), one document per module, class or function with a docstring of
at least 200 characters. The tokenizer is a byte-level BPE with 4,096 ids trained on it,
with ``<|endoftext|>`` as id 0. Run: ``python scripts/make_sample.py``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path

MODULES = ["json", "csv", "pathlib", "collections", "functools", "itertools", "argparse",
           "logging", "datetime", "decimal", "fractions", "statistics", "textwrap", "string",
           "difflib", "heapq", "bisect", "shutil", "tempfile", "zipfile", "tarfile", "gzip",
           "email", "http", "urllib", "asyncio", "concurrent", "multiprocessing", "threading",
           "subprocess", "socket", "ssl", "sqlite3", "unittest", "doctest", "pdb", "pickle",
           "copy", "enum", "typing", "dataclasses", "contextlib", "abc", "io", "os", "re"]


def docstrings() -> list[str]:
    seen: set[int] = set()
    out: list[str] = []
    for name in MODULES:
        mods = [importlib.import_module(name)]
        pkg = mods[0]
        if hasattr(pkg, "__path__"):
            for info in pkgutil.iter_modules(pkg.__path__, name + "."):
                if info.name.endswith("__main__") or ".test" in info.name:
                    continue
                try:
                    mods.append(importlib.import_module(info.name))
                except Exception:
                    continue
        for mod in mods:
            objs = [mod] + [o for _, o in inspect.getmembers(mod)
                            if inspect.isclass(o) or inspect.isfunction(o)]
            for obj in objs:
                doc = inspect.getdoc(obj)
                if doc and len(doc) >= 200 and id(doc) not in seen:
                    seen.add(id(doc))
                    out.append(doc)
    return out


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    here = Path(__file__).resolve().parent.parent / "sample"
    here.mkdir(exist_ok=True)
    docs = sorted(set(docstrings()))
    with open(here / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.save(str(here / "tokenizer.json"))
    print(f"{len(docs)} documents, python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
