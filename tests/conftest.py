"""Shared fixtures: the bundled sample, and corpora the tests make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample"


@pytest.fixture(scope="session")
def tokenizer_path() -> Path:
    return SAMPLE / "tokenizer.json"


@pytest.fixture(scope="session")
def sample_corpus() -> Path:
    return SAMPLE / "corpus.jsonl"


def sample_texts() -> list[str]:
    with open(SAMPLE / "corpus.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def write_jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, key: t}) + "\n")
    return path


@pytest.fixture(scope="session")
def big_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 4 MB of JSONL: the sample repeated with a marker per copy."""
    d = tmp_path_factory.mktemp("big")
    texts = [f"[copy {k}] {t}" for k in range(10) for t in sample_texts()]
    return write_jsonl(d / "big.jsonl", texts)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run ``shardwise …`` through the real entry point: ``cli("inspect", path)`` →
    (exit code, stdout, stderr); argparse's exits (usage errors, ``--help``) are codes too.
    Only the command run is registered, so a test does not import every command."""
    from shardwise.cli import main as cli_main

    commands = cli_main.SUBCOMMANDS  # all of them, before any test narrows the list

    def run(*argv: object) -> tuple[int, str, str]:
        args = [str(a) for a in argv]
        if args and args[0] in commands:
            monkeypatch.setattr(cli_main, "SUBCOMMANDS", (args[0],))
        try:
            code = cli_main.main(args)
        except SystemExit as e:
            code = int(e.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run
