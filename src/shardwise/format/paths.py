"""Paths stored in a cache are relative and never leave the cache directory; where
readers keep what they write beside a cache."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from shardwise.errors import ManifestError
from shardwise.format.confined import open_dir

READER_DIR = ".shardwise-plans"
CONTROL = re.compile("[\x00-\x1f\x7f]")
"""A control character (NUL, newline, escape ...): never part of a name a cache holds."""


def safe_join(root: Path, relative: str, *, where: str) -> Path:
    """``root / relative``, refusing absolute paths and any path that escapes ``root``
    (through ``..`` or a symlink, of a directory or of the file itself) and any name with
    a control character (:data:`CONTROL`): the one check of a name a cache holds.

    ``where`` names the file that holds the path (or the file itself), for the message.
    """
    if CONTROL.search(relative):
        raise ManifestError(f"{where}: path {relative!r} holds a control character; a "
                            "cache's names are printable (a newline would forge a line of "
                            "a log, a NUL cut a name): the cache is damaged or hostile, "
                            "rebuild it from its sources")
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or "\\" in relative or ".." in pure.parts:
        raise ManifestError(f"{where}: path {relative!r} is not a relative path inside the "
                            f"cache {root}; a cache never names files outside itself")
    joined = (root / pure).resolve()
    base = root.resolve()
    if joined != base and base not in joined.parents:
        raise ManifestError(f"{where}: path {relative!r} resolves to {joined}, outside the "
                            f"cache {root}; a cache never reads files outside itself (copy "
                            "the file into the cache instead of linking it)")
    return root / pure


SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",  # S3 presigned
    "x-goog-signature", "x-goog-credential",  # GCS signed
    "sig",  # Azure SAS
    "signature", "token", "access_token", "id_token", "refresh_token", "auth", "key",
    "api_key", "apikey", "password", "secret", "client_secret", "credential", "sas",
    "x-ms-signature", "security-token",
})
"""Query parameters whose value is (part of) a credential, lower-case."""
REDACTED = "REDACTED"
_NETLOC = re.compile(r"[^/?#]*")


def redact_url(url: str) -> str:
    """``url`` as shardwise may store or print it: without its userinfo (``user:pass@``)
    and with the value of every credential parameter of its query (:data:`SECRET_PARAMS`)
    replaced by ``REDACTED``; anything that is not ``scheme://…`` unchanged. Reading
    still uses the full URL, which is never written to a cache, a state or a message::

        https://me:pw@host/a.jsonl?X-Amz-Signature=9f2c&v=1  ->  https://host/a.jsonl?X-Amz-Signature=REDACTED&v=1
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = _NETLOC.match(rest).end()  # type: ignore[union-attr]  # always matches
    rest = rest[:end].rpartition("@")[2] + rest[end:]
    path, q, query = rest.partition("?")
    if q:
        query = "&".join(_redact_param(p) for p in query.split("&"))
    return f"{scheme}://{path}{q}{query}"


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    return f"{name}={REDACTED}" if eq and unquote(name).lower() in SECRET_PARAMS else param


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/shardwise`` (default ``~/.cache/shardwise``)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shardwise"


def reader_dir(root: Path) -> Path:
    """Where readers keep what they write about a cache (plan caches, the node's record of
    verified chunks): ``<root>/.shardwise-plans`` when the cache directory is writable
    (made if missing; a symlink there is a :class:`~shardwise.errors.CacheError`), else
    :func:`user_cache_dir` (file names there are keyed by the cache's identity). What is
    written in it goes through :func:`~shardwise.format.confined.open_under`."""
    if os.access(root, os.W_OK):
        try:  # a symlink a cache ships: a CacheError, never followed
            os.close(open_dir(root, READER_DIR))
            return root / READER_DIR
        except OSError:  # a file there: as if read-only
            pass
    return user_cache_dir()
