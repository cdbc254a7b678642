"""Safe publication: a build killed with SIGKILL at any point resumes to identical bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers_cache import assert_same_cache, published_chunks

import shardwise as sw
from shardwise.storage.verify import verify_cache
from shardwise.writer.api import build

ARGS = dict(workers=2, chunk_docs=16, segment_bytes=250_000, progress=False)



def _start_build(src: Path, out: Path, tok: Path) -> subprocess.Popen[bytes]:
    code = ("import sys; from shardwise.writer.api import build; "
            f"build([{str(src)!r}], {str(out)!r}, tokenizer={str(tok)!r}, **{ARGS!r})")
    return subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[2])


def _kill_after(proc: subprocess.Popen[bytes], out: Path, chunks: int, timeout: float = 60
                ) -> int:
    deadline = time.monotonic() + timeout
    while published_chunks(out) < chunks and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return published_chunks(out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, big_corpus: Path,
              tokenizer_path: Path) -> Path:
    out = tmp_path_factory.mktemp("ref") / "cache"
    build([big_corpus], out, tokenizer=tokenizer_path, **ARGS)
    return out


@pytest.mark.parametrize("kill_at", [-1, 1, 25, 120])
def test_killed_build_resumes_to_identical_bytes(tmp_path: Path, big_corpus: Path,
                                                 tokenizer_path: Path, reference: Path,
                                                 kill_at: int) -> None:
    out = tmp_path / "cache"
    total = len(sw.open_cache(reference).chunks)
    assert total > kill_at + 20  # the kill lands mid-build
    proc = _start_build(big_corpus, out, tokenizer_path)
    published = _kill_after(proc, out, kill_at)
    assert published < total, "the build finished before it could be killed"
    if published >= 0:  # a mid-build reader sees exactly the published chunks, all valid
        cache = sw.open_cache(out)
        assert not cache.finished
        ref = sw.open_cache(reference)
        for i in range(len(cache.chunks)):
            assert cache.chunks[i].stem == ref.chunks[i].stem
            assert (cache.tokens(i) == ref.tokens(i)).all()
    # kill the resumed build once more, then let it finish
    again = _start_build(big_corpus, out, tokenizer_path)
    _kill_after(again, out, published + 10)
    summary = build([big_corpus], out, tokenizer=tokenizer_path, **ARGS)
    assert summary.chunks == total
    assert_same_cache(reference, out)
    assert verify_cache(out).ok


def test_no_orphan_workers_after_kill(tmp_path: Path, big_corpus: Path,
                                      tokenizer_path: Path) -> None:
    out = tmp_path / "cache"
    proc = _start_build(big_corpus, out, tokenizer_path)
    _kill_after(proc, out, 2)
    marker = str(out).encode()

    def survivors() -> list[str]:
        # forked workers share the killed build's command line, which names ``out``
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(pid)
                except OSError:
                    continue
        return found

    deadline = time.monotonic() + 5
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors() == []


def _crash_once_at(record: dict, marker: str, text: str) -> list[int]:
    """Char ids; at record ``text`` the first time (``marker`` made atomically): SIGSEGV."""
    if record["text"] == text:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            import ctypes

            ctypes.string_at(0)  # a native crash, as a tokenizer's bug would be
    return [ord(ch) % 250 for ch in record["text"]]


def test_a_worker_that_crashes_in_native_code_is_retried_from_the_ledger(
        tmp_path: Path, sample_corpus: Path) -> None:
    """A worker's SIGSEGV mid-segment (chunks already reported) is a CrashRetried warning
    carrying the stack it crashed on; what it left runs again and the cache is byte for byte
    a build that never crashed."""
    import functools

    from tests.conftest import sample_texts

    from shardwise.errors import CrashRetried

    marker = str(tmp_path / "crashed")
    fn = functools.partial(_crash_once_at, marker=marker, text=sample_texts()[300])
    args = dict(processor=fn, vocab_size=256, workers=2, chunk_docs=16,
                segment_bytes=20_000, progress=False)
    with pytest.warns(CrashRetried, match=r"(?s)died with signal SIGSEGV.*_crash_once_at"
                                          r".*runs again from the ledger \(retry 1 of 1\)"):
        summary = build([sample_corpus], tmp_path / "a", **args)
    assert os.path.exists(marker)
    clean = build([sample_corpus], tmp_path / "b", **args)  # marker made: no crash
    assert summary.documents == clean.documents == len(sample_texts())
    assert_same_cache(tmp_path / "a", tmp_path / "b")
    assert verify_cache(tmp_path / "a").ok
