"""Errors a user can act on: real faults (not mocks) give one line naming the path, the
cause and what to do, with a documented exit status; ``--debug`` adds the traceback.

The tests run as root, which ignores permission bits, so each fault is one the kernel
raises for root too: a file where a directory is expected (ENOTDIR), sysfs refusing a new
directory (EPERM), a file size limit (``RLIMIT_FSIZE``: EFBIG; Python ignores SIGXFSZ),
and ``/dev/full`` as standard output (ENOSPC).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import shardwise
from shardwise.cli import main as cli_main

SAMPLE = Path(__file__).resolve().parents[2] / "sample"
SRC = str(Path(shardwise.__file__).resolve().parents[1])


def _shardwise(*argv: object, stdout: int | None = subprocess.PIPE,
               preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "shardwise.cli.main", *map(str, argv)],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                          preexec_fn=preexec, check=False, timeout=300)


def _build(out: object, *extra: object) -> list[object]:
    return ["build", SAMPLE / "corpus.jsonl", "--out", out, "--tokenizer",
            SAMPLE / "tokenizer.json", "--workers", 1, "--no-progress", *extra]


def _one_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"shardwise {command}: error: ")
    return lines[0]


def test_an_output_path_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file")
    done = _shardwise(*_build(tmp_path / "out"))
    assert done.returncode == 2
    assert _one_line(done, "build").endswith(
        f"{tmp_path / 'out'}: exists and is not a directory; a cache is a directory: choose "
        "a new or empty directory, or an existing cache")


@pytest.mark.parametrize("command", ["build", "convert"])
def test_a_path_under_a_file_names_it_and_exits_3(tmp_path: Path, command: str) -> None:
    (tmp_path / "file").write_text("a file")
    out = tmp_path / "file" / "cache"
    argv = (_build(out) if command == "build" else
            ["convert", "--from-megatron", tmp_path / "none", "--out", out])
    if command == "convert":  # a real Megatron prefix to import
        shardwise.build([SAMPLE / "corpus.jsonl"], tmp_path / "c", tokenizer=SAMPLE /
                        "tokenizer.json", workers=1, progress=False)
        from shardwise.writer.convert import to_megatron

        to_megatron(tmp_path / "c", tmp_path / "none")
    done = _shardwise(*argv)
    assert done.returncode == 3, done.stderr
    assert _one_line(done, command) == (
        f"shardwise {command}: error: {out}: Not a directory [ENOTDIR]: a part of this path "
        "is a file, not a directory: choose another path")


def test_permission_denied_names_the_directory(tmp_path: Path) -> None:
    out = Path("/sys/shardwise-test-cache")  # sysfs refuses mkdir: EPERM to root, else EACCES
    done = _shardwise(*_build(out))
    assert done.returncode == 3
    line = _one_line(done, "build")
    assert re.fullmatch(rf"shardwise build: error: {out}: (Operation not permitted \[EPERM\]|"
                        r"Permission denied \[EACCES\]): this user may not write \(or read\) "
                        r"there: choose another location, or change its permissions", line), line


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))


def test_a_file_size_limit_names_the_chunk_and_debug_shows_both_tracebacks(
        tmp_path: Path) -> None:
    """The chunk is written in a worker process: its traceback comes back too."""
    out = tmp_path / "cache"
    done = _shardwise(*_build(out), preexec=_small_files)
    assert done.returncode == 3
    assert _one_line(done, "build") == (
        f"shardwise build: error: {out}/chunks/00000/00000-00000.bin: File too large [EFBIG]: "
        "the file is larger than this process may write (ulimit -f) or the file system "
        "allows: raise the limit or make smaller chunks (--chunk-mb), then run the same "
        "command again")
    assert not list(out.rglob(".tmp-*"))  # the partial file is gone: space is given back

    debug = _shardwise(*_build(out, "--debug"), preexec=_small_files)
    assert debug.returncode == 3
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert "raised in a build worker:" in debug.stderr and "in write_temp" in debug.stderr
    assert debug.stderr.splitlines()[-1] == done.stderr.strip()

    again = _shardwise(*_build(out, "--json"))  # without the limit the build resumes
    assert again.returncode == 0, again.stderr


def test_a_full_disk_under_standard_output_is_named(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shardwise.build([SAMPLE / "corpus.jsonl"], cache, tokenizer=SAMPLE / "tokenizer.json",
                    workers=1, progress=False)
    for argv, command in ((["verify", cache], "verify"), (["inspect", cache], "inspect"),
                          (["inspect", cache, "--debug"], "inspect")):
        with open("/dev/full", "w") as full:
            done = _shardwise(*argv, stdout=full.fileno())
        assert done.returncode == 3
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"shardwise {command}: error: standard output: No space left "
                               "on device [ENOSPC]: free space")
        assert ("Traceback" in done.stderr) == ("--debug" in argv)


def test_every_command_documents_the_exit_status(capsys: pytest.CaptureFixture[str]
                                                 ) -> None:
    for argv in (["--help"], ["build", "--help"], ["inspect", "--help"],
                 ["verify", "--help"], ["convert", "--help"], ["bench", "--help"],
                 ["bench", "read", "--help"], ["bench", "build", "--help"]):
        with pytest.raises(SystemExit) as e:
            cli_main.main(argv)
        assert e.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "exit status: 0 success; 1 verify found damage; 2 usage or input error" in text
        assert "3 environment error (disk full, permission denied" in text
        assert "--debug" in text, argv


def test_an_unexpected_exception_is_an_internal_error_with_its_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from shardwise.cli import inspect_cmd

    def broken(args: object) -> int:
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ("inspect",))
    monkeypatch.setattr(inspect_cmd, "run", broken)
    assert cli_main.main(["inspect", "x"]) == cli_main.EXIT_INTERNAL == 4
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith(
        "shardwise inspect: internal error: RuntimeError: something nobody expected (a bug")
