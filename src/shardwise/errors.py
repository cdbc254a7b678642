"""One exception tree for everything shardwise raises on purpose.

::

    ShardwiseError
    ├── ConfigError          (also ValueError)   an option or argument is invalid
    ├── MissingExtraError    (also ImportError)  an optional dependency is not installed
    ├── InputError                               a source record is bad: file, line, reason
    ├── CacheError                               a cache on disk cannot be used as asked
    │   ├── CorruptChunkError                    a damaged chunk file, named by path
    │   ├── ManifestError                        a manifest or ledger that is invalid or unsafe
    │   └── CacheMismatchError                   an existing cache was built with other arguments
    ├── StateError           (also ValueError)   a checkpoint state that does not match
    ├── ProducerTimeoutError (also TimeoutError) a producer stopped publishing
    └── RemoteError                              an object store failed or stopped answering
                                                 past its retry policy, named by URL

Catch ``ShardwiseError`` to handle all of them; every message says what, where,
expected versus got, and what to do.

One warning: :class:`CrashRetried`, a local build worker that crashed in native code and
whose unfinished work ran again (the build went on; the message carries the crash's stack).
"""

from __future__ import annotations


class ShardwiseError(Exception):
    """Base of every error shardwise raises deliberately."""


class ConfigError(ShardwiseError, ValueError):
    """An option, argument or combination of them is invalid."""


class MissingExtraError(ShardwiseError, ImportError):
    """An optional dependency is needed; the message has the exact install line."""


class InputError(ShardwiseError):
    """A source record cannot be processed.

    ``path``, ``line`` (1-based, or None) and ``reason`` (a short key such as
    ``invalid_json``) are kept as attributes so callers can count or report them.
    """

    def __init__(self, message: str, *, path: str = "", line: int | None = None,
                 reason: str = "error") -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.reason = reason

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # keep path/line/reason across process boundaries (pickle uses args only)
        return (_make_input_error, (str(self), self.path, self.line, self.reason))


def _make_input_error(message: str, path: str, line: int | None, reason: str) -> InputError:
    return InputError(message, path=path, line=line, reason=reason)


class CacheError(ShardwiseError):
    """A cache directory cannot be used as asked."""


class CorruptChunkError(CacheError):
    """A chunk file is truncated, has flipped bits or a wrong header."""


class ManifestError(CacheError):
    """A manifest or ledger is invalid, unreadable, or names a path outside the cache."""


class CacheMismatchError(CacheError):
    """An existing cache was built with different arguments than this build asks for."""


class StateError(ShardwiseError, ValueError):
    """A checkpoint state does not match the data or the configuration."""


class ProducerTimeoutError(ShardwiseError, TimeoutError):
    """A producer (a build or an external writer) stopped publishing for too long."""


class RemoteError(ShardwiseError):
    """An object store did not answer, or kept failing, past the retry policy
    (:mod:`shardwise.remote.policy`); ``url`` names the object. Not an ``OSError`` on
    purpose: code that treats ``OSError`` as "file missing" must not swallow it."""

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(message)
        self.url = url

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_make_remote_error, (str(self), self.url))  # keep url across processes


def _make_remote_error(message: str, url: str) -> RemoteError:
    return RemoteError(message, url=url)


class CrashRetried(RuntimeWarning):
    """A local worker died of a crash signal (SIGSEGV...) and its unfinished work ran again
    from the ledger: the result is the same, but the crash is worth a look — the message
    carries the Python stack it crashed on."""
