"""Shared fixtures: the bundled sample, corpora the tests make, and one real S3 server
per session (SeaweedFS: shardwise.bench.seaweed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.faults import FaultProxy

    from shardwise.bench.seaweed import S3Server

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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS on 127.0.0.1, one per session, its credentials and endpoint in the
    environment (``AWS_ENDPOINT_URL``…) for the rest of the session; make a bucket with
    ``s3_server.make_bucket(name)`` (a name of the test file's own)."""
    from shardwise.bench.seaweed import s3_environment, seaweed_s3

    with seaweed_s3(tmp_path_factory.mktemp("seaweedfs")) as server, \
            s3_environment(server.env):
        yield server


@pytest.fixture
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's S3 server (no fault until the test
    calls ``fault_proxy.inject(Fault(...))``); its endpoint: ``fault_proxy.endpoint``."""
    from tests.faults import FaultProxy

    with FaultProxy(s3_server.address) as proxy:
        yield proxy


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
