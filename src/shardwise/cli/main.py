"""``shardwise`` entry point: one subcommand per module, each ``add_parser`` + ``run``.

Every subcommand builds a config, calls one library function, prints a human summary
(``--json`` for machines) and returns an exit code. Errors are turned into one line here,
for every command alike (``--debug`` adds the traceback)::

    shardwise build: error: out/chunks/00000/00000-00003.bin: No space left on device
    [ENOSPC]: free space on that file system or choose another location, then run the same
    command again (a build continues where it stopped)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from shardwise.errors import ShardwiseError

SUBCOMMANDS = ("build", "inspect", "verify", "convert", "trace", "bench")
STDOUT = "standard output"  # how an OSError of writing the output names it

EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_ENVIRONMENT = 0, 1, 2, 3
EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 4, 130, 141
EXIT_STATUS = ("exit status: 0 success; 1 verify found damage; 2 usage or input error (bad "
               "arguments or records, an output path that is a file, a cache built with "
               "other arguments, or damaged); 3 environment error (disk full, permission "
               "denied, read-only file system, a path the system cannot use, a worker "
               "killed); 4 internal error (a bug: report it with the traceback); 130 "
               "interrupted; 141 the output pipe closed early (| head). --debug prints the "
               "traceback of an error.")

_ADVICE = {  # what to do about an OSError, by errno
    errno.ENOSPC: "free space on that file system or choose another location, then run the "
                  "same command again (a build continues where it stopped)",
    errno.EDQUOT: "your disk quota is used up: free space or choose another location, then "
                  "run the same command again (a build continues where it stopped)",
    errno.EFBIG: "the file is larger than this process may write (ulimit -f) or the file "
                 "system allows: raise the limit or make smaller chunks (--chunk-mb), then "
                 "run the same command again",
    errno.EROFS: "the file system is read-only: choose a writable location",
    errno.EACCES: "this user may not write (or read) there: choose another location, or "
                  "change its permissions",
    errno.EPERM: "this user may not write (or read) there: choose another location, or "
                 "change its permissions",
    errno.ENOTDIR: "a part of this path is a file, not a directory: choose another path",
    errno.EISDIR: "a directory is where a file was expected: check the path",
    errno.ENOENT: "check the path",
    errno.EEXIST: "something is in the way: choose another path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or use fewer workers",
    errno.ENOMEM: "out of memory: use fewer workers, or free memory",
    errno.EIO: "the disk or network file system failed: check it, then run the same "
               "command again",
}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardwise",
        description="Build tokenized, chunked, checksummed caches and check them.",
        epilog=EXIT_STATUS)
    from shardwise._version import __version__

    parser.add_argument("--version", action="version", version=f"shardwise {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error, not only its one-line message")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"shardwise.cli.{name}_cmd")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
        _add_common(p)
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    """``--debug`` and the exit status on every command, and on its subcommands."""
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="print the traceback of an error, not only its one-line message")
    kind = p.formatter_class
    raw = isinstance(kind, type) and issubclass(kind, argparse.RawDescriptionHelpFormatter)
    status = textwrap.fill(EXIT_STATUS, 88) if raw else EXIT_STATUS
    p.epilog = f"{p.epilog}\n\n{status}" if p.epilog else status
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_common(child)


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    stdout, sys.stdout = sys.stdout, _NamedStream(sys.stdout, STDOUT)
    # SIGTERM (a scheduler's preemption, ``kill``) is handled as Ctrl-C is: the command
    # stops its workers and the servers a bench started and exits 130, where the default
    # action killed this process alone and left them running (only the main thread can
    # set a handler)
    on_main = threading.current_thread() is threading.main_thread()
    term = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
    try:
        code = int(args._run(args))
        sys.stdout.flush()  # a full disk under `--json > file` is this command's error
        return code
    except (Exception, KeyboardInterrupt) as e:
        return _fail(args, e, stdout)
    finally:
        sys.stdout = stdout
        if on_main:
            signal.signal(signal.SIGTERM, term if term is not None else signal.SIG_DFL)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _fail(args: argparse.Namespace, e: BaseException, stdout: TextIO) -> int:
    """Say what went wrong in one line (with the traceback under ``--debug`` or for a
    bug); return the exit status."""
    if isinstance(e, BrokenPipeError) and e.filename == STDOUT:  # `… | head` read enough
        with contextlib.suppress(OSError, ValueError):  # so the flush at exit fails no more
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        return EXIT_BROKEN_PIPE
    if getattr(args, "debug", False) or exit_code(e) == EXIT_INTERNAL:
        traceback.print_exc()
    print(f"shardwise {args.command}: {describe(e)}", file=sys.stderr)
    return exit_code(e)


def exit_code(e: BaseException) -> int:
    """The documented exit status (EXIT_STATUS) of a command that raised ``e``."""
    from shardwise.concurrency.pool import WorkerCrashed

    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(e, (OSError, WorkerCrashed)):
        return EXIT_ENVIRONMENT
    if isinstance(e, ShardwiseError):
        return EXIT_USAGE
    return EXIT_INTERNAL


def describe(e: BaseException) -> str:
    """One line: what happened, to which path, and what to do."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if isinstance(e, OSError):
        return f"error: {describe_os_error(e)}"
    if isinstance(e, ShardwiseError):
        return f"error: {e}"
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return (f"internal error: {type(e).__name__}: {first} (a bug in shardwise or a library "
            "it uses; please report it with the traceback above)")


def describe_os_error(e: OSError) -> str:
    """``<path>: <cause> [ERRNO]: <what to do>``; the path as the system reported it."""
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    where = " -> ".join(paths) if paths else "(the system named no path)"
    code = errno.errorcode.get(e.errno or 0, "")
    cause = e.strerror or str(e)
    advice = _ADVICE.get(e.errno or 0, "check the path and the system, then run the same "
                                       "command again; --debug shows where it happened")
    return f"{where}: {cause}{f' [{code}]' if code else ''}: {advice}"


class _NamedStream:
    """A text stream whose OSErrors name it: ``print`` into a full disk raises ENOSPC
    naming no file, and the user should read "standard output", not nothing."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream, self._name = stream, name

    def write(self, text: str) -> int:
        with self._naming():
            return self._stream.write(text)

    def flush(self) -> None:
        with self._naming():
            self._stream.flush()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._stream, attr)

    @contextlib.contextmanager
    def _naming(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            if e.filename is None:
                e.filename = self._name
            raise


if __name__ == "__main__":
    sys.exit(main())
