"""The clean caches every fuzz case starts from, made once per session: a finished cache
(with its index, and the plan files a document-shuffled read writes beside it) and one
whose ledger is a snapshot plus a journal record (a build mid-way, readers parse both)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cachefactory import make_cache, sample_docs
from tests.fuzz.harness import Clean

from shardwise.format.files import LocalFiles
from shardwise.format.journal import Journal
from shardwise.format.ledger import JOURNAL_DIR, Ledger
from shardwise.format.paths import READER_DIR

EXAMPLES = int(os.environ.get("SHARDWISE_FUZZ_EXAMPLES", "0"))
"""0: the fast seeded run of the suite; N: a long run of N examples per test, drawn at
random (docs/DESIGN.md, "Testing notes")."""


def examples(fast: int) -> dict[str, object]:
    """Hypothesis settings: ``fast`` derandomized examples, or the long run's count."""
    from hypothesis import HealthCheck

    checks = [HealthCheck.too_slow, HealthCheck.data_too_large,
              HealthCheck.function_scoped_fixture]
    if EXAMPLES:
        return {"max_examples": EXAMPLES, "deadline": None, "suppress_health_check": checks,
                "derandomize": False, "database": None}
    return {"max_examples": fast, "deadline": None, "suppress_health_check": checks,
            "derandomize": True, "database": None, "print_blob": True}


@pytest.fixture(scope="session", autouse=True)
def user_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Readers that cannot write beside a cache write under $XDG_CACHE_HOME: a directory
    of the session's, so a case's writes are all seen."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


def _cache(root: Path) -> Path:
    docs = sample_docs(30, seed=7, max_len=60)
    return make_cache(root, [docs[:16], docs[16:]], chunk_docs=5, eod_id=0)


@pytest.fixture(scope="session")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Clean:
    """A finished cache, read once by every reader (which leaves its plan files)."""
    clean = Clean.of(_cache(tmp_path_factory.mktemp("fuzz-finished") / "cache"))
    shutil.rmtree(clean.root / READER_DIR / "verified", ignore_errors=True)  # per node
    return clean


@pytest.fixture(scope="session")
def journaled(tmp_path_factory: pytest.TempPathFactory) -> Clean:
    """The same cache, its ledger a snapshot without source 1's last chunks and a journal
    record that adds them (and finishes the segment)."""
    root = _cache(tmp_path_factory.mktemp("fuzz-journal") / "cache")
    files = LocalFiles(root)
    full = Ledger.load(files)
    snapshot = Ledger.load(files)
    seg = snapshot.sources[1].segments[0]
    seg.chunks, seg.finished = seg.chunks[:1], False
    seg.position = seg.line = seg.chunks[0].documents
    snapshot.save(files)
    journal = Journal(files, snapshot)
    snapshot.sources[1].segments[0] = full.sources[1].segments[0]
    journal.touch(1, 0)
    journal.save()
    assert Ledger.load(files).sources == full.sources
    before = Path(shutil.copytree(root, root.parent / "before"))
    shutil.rmtree(before / JOURNAL_DIR)
    clean = Clean.of(root)
    clean.also.append(Clean.reads_of(before))
    return clean
