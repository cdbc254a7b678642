"""The store's faults: how every request to an object store is bounded and retried.

One policy, applied by :class:`~shardwise.remote.client.RemoteStore` to every request it
makes — the reader's downloads (in the main process, in DataLoader workers, in the
download threads), opening a cache, ``verify``, and the build's writers:

* **timeouts on every request**: ``connect_timeout`` to open a connection, and
  ``read_timeout`` without a byte from the store (the client library's own: botocore's
  for ``s3://``);
* **bounded retries** of what a store does when it is busy or a network hiccups —
  5xx answers, 503 SlowDown and other throttling (429, ``Throttling``…), connection
  resets and refusals, timeouts, short bodies (fewer bytes than promised), and a body
  the client's own checksum refused (botocore's ``FlexibleChecksumError``) — at most
  ``attempts`` tries, waiting between them with exponential backoff and full jitter
  (``uniform(0, min(max_backoff, first_backoff × 2^k))``, so that a thousand ranks
  throttled at once do not come back at once);
* **a bound**: a try that gets no byte fails after ``connect_timeout`` or
  ``read_timeout`` (the client's timeouts), and every try is cancelled after
  :meth:`RemotePolicy.try_limit` whatever happens (those timeouts plus its bytes at
  ``min_rate``: a client stuck somewhere its timeouts do not reach, e.g. waiting for a
  ``100 Continue``, is cut too); no retry starts later than ``deadline`` seconds after
  the first try. So a store that stops answering raises
  :class:`~shardwise.errors.RemoteError`, naming the URL, within
  :meth:`RemotePolicy.bound` seconds: ``deadline + connect_timeout + read_timeout +
  size / min_rate`` = 100 s by default for the reader's 32 MiB pieces, 106 s for a 64 MiB
  chunk's PUT — at most 2 minutes — never a hang.

**Another bound** for one store: ``RemoteStore(url, policy=RemotePolicy(...))`` (and
``open_cache`` takes that store). For everything a run makes itself — a build's writers
and bucket sources in every worker process, ``verify``, the CLI — the environment variable
``SHARDWISE_REMOTE_POLICY`` sets the fields to change, e.g.
``SHARDWISE_REMOTE_POLICY="read_timeout=5,deadline=20"`` (:meth:`RemotePolicy.from_env`;
the others keep their defaults). Processes started here inherit it; on a Ray cluster
started elsewhere, give it to the tasks too (``runtime_env={"env_vars": {...}}``).

Anything else (a missing object: ``FileNotFoundError``; access denied; a bad request)
is raised at once, unchanged. Wrong bytes that reach shardwise are caught by the cache's
own checksums (:class:`~shardwise.errors.CorruptChunkError`, naming the object's URL).

The client library's own retries are switched off (botocore ``total_max_attempts=1``, s3fs
``retries=1``): one policy decides, not three stacked ones.

**Expiring credentials** are the client's provider chain's business, never shardwise's:
botocore refreshes credentials that carry an expiry (an assumed role, a web identity
token, ECS/EC2 instance metadata, an SSO profile or a ``credential_process``) shortly
before they expire, on whichever request needs them, in every process. So for a long run
name a profile or role (``AWS_PROFILE``, ``AWS_ROLE_ARN`` + ``AWS_WEB_IDENTITY_TOKEN_FILE``,
instance metadata) and do not pass a fixed ``key``/``secret``/``token`` in
``storage_options``: those are used as given until they expire.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from shardwise.errors import ConfigError, RemoteError

T = TypeVar("T")
POLICY_ENV = "SHARDWISE_REMOTE_POLICY"
_SMALL = 8 << 20  # the size assumed for a request whose size is not known

# error names of the client libraries (botocore, aiohttp, urllib3, obstore…) that mean
# "the network or the store failed this time": matched by name along the exception's
# chain, so that no client library is imported to classify its errors
_TRANSIENT_NAMES = frozenset({
    "ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError",
    "ConnectionClosedError", "HTTPClientError", "ResponseStreamingError",
    "IncompleteReadError", "IncompleteRead", "ClientPayloadError",
    "ServerDisconnectedError", "ClientConnectionError", "ClientOSError",
    "ServerTimeoutError", "FlexibleChecksumError", "ResponseParserError", "FSTimeoutError",
    "ProtocolError", "ChunkedEncodingError", "ReadTimeout", "ConnectTimeout",
})
_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestLimitExceeded", "TooManyRequests",
    "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable",
    "XAmzContentSHA256Mismatch", "BadDigest",
})
_TRANSIENT_TEXT = ("SlowDown", "reduce your request rate", "Service Unavailable",
                   "Internal Server Error", "Bad Gateway", "Gateway Timeout")
# obstore's errors (a GenericError whose text names the cause: matched on it)
_NATIVE_TRANSIENT = re.compile(
    r"status code: (5\d\d|429)|SlowDown|Throttl|timed out|[Tt]imeout|error sending request|"
    r"[Cc]onnection|error decoding response body|IncompleteBody|end of file before|"
    r"unexpected EOF|reset by peer|[Bb]roken pipe")
_TRANSIENT_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED,
                               errno.EPIPE, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                               errno.ENETUNREACH})


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _status(e: BaseException) -> tuple[str, int]:
    """A botocore-style error's code and HTTP status ("", 0 if it has none)."""
    resp = getattr(e, "response", None)
    if not isinstance(resp, dict):
        return "", 0
    code = str(resp.get("Error", {}).get("Code", ""))
    status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return code, int(status) if str(status).isdigit() else 0


def is_transient(error: BaseException) -> bool:
    """True if ``error`` (or an error it was raised from) is worth another try: see the
    module docstring. A missing object, denied access or a bad request is not."""
    if isinstance(error, (FileNotFoundError, PermissionError, RemoteError)):
        return False
    for e in _chain(error):
        code, status = _status(e)
        if status >= 500 or status == 429 or code in _TRANSIENT_CODES \
                or (code.isdigit() and (int(code) >= 500 or int(code) == 429)):
            return True
        if type(e).__name__ in _TRANSIENT_NAMES or isinstance(
                e, (ConnectionError, TimeoutError, socket.timeout)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if isinstance(e, OSError) and any(t in str(e) for t in _TRANSIENT_TEXT):
            return True
        if type(e).__module__.startswith("obstore") and _NATIVE_TRANSIENT.search(str(e)) \
                and type(e).__name__ not in ("PermissionDeniedError", "UnauthenticatedError"):
            return True
    return False


def _said(error: BaseException) -> str:
    """What ``error`` says, in 300 characters: for obstore's, its first paragraph and the
    kind of its innermost failure (``(Timeout)``), not the debug dump after them, whose
    first 300 characters name neither."""
    text = str(error)
    if type(error).__module__.startswith("obstore"):
        head, _, debug = text.partition("\n\nDebug source:")
        kinds = re.findall(r"kind: (\w+)", debug)
        text = head + (f" ({kinds[0]})" if kinds else "")
    return text[:300]


def _positive(name: str, v: object, *, finite: bool = True) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
            or (finite and v == float("inf")):
        raise ConfigError(f"RemotePolicy.{name} must be a positive number of seconds, "
                          f"got {v!r}")


@dataclass(frozen=True)
class RemotePolicy:
    """Timeouts and retries for every request to an object store (see the module
    docstring). Defaults bound a silent store to 92–106 s; tests use a few seconds.

    >>> RemotePolicy(read_timeout=5, deadline=20).bound(4 << 20)
    36.0
    """

    connect_timeout: float = 10.0
    read_timeout: float = 20.0  # seconds without a byte from the store, per try
    attempts: int = 8           # tries per request, the first included
    first_backoff: float = 0.1  # the wait before the first retry (at most; jittered)
    max_backoff: float = 5.0
    deadline: float = 60.0      # no retry starts later than this after the first try
    min_rate: float = 4 << 20   # bytes/s: a try slower than this counts as stalled

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "first_backoff", "max_backoff",
                     "deadline", "min_rate"):
            _positive(name, getattr(self, name))
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) \
                or self.attempts < 1:
            raise ConfigError(f"RemotePolicy.attempts must be an int ≥ 1, got "
                              f"{self.attempts!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RemotePolicy:
        """The policy ``SHARDWISE_REMOTE_POLICY`` sets (``"read_timeout=5,deadline=20"``:
        fields of this class; the others keep their defaults), or the default if it is
        unset or empty.

        >>> RemotePolicy.from_env({"SHARDWISE_REMOTE_POLICY": "deadline=5"}).deadline
        5.0
        """
        text = (os.environ if environ is None else environ).get(POLICY_ENV, "").strip()
        if not text:
            return DEFAULT_POLICY
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            name, eq, value = (x.strip() for x in item.partition("="))
            try:
                if not eq or name not in names:
                    raise ValueError
                values[name] = int(value) if name == "attempts" else float(value)
            except ValueError:
                raise ConfigError(
                    f"{POLICY_ENV}={text!r}: {item!r} is not name=number with a name of "
                    f"{sorted(names)}; e.g. {POLICY_ENV}='read_timeout=5,deadline=20'"
                ) from None
        try:
            return cls(**values)
        except ConfigError as e:
            raise ConfigError(f"{POLICY_ENV}={text!r}: {e}") from None

    def try_limit(self, size: int | None = None) -> float:
        """Seconds one try of a request moving ``size`` bytes (None: a small object, at
        most 8 MiB) may take in all, however the store behaves: cancelled after that."""
        return self.connect_timeout + self.read_timeout + (size or _SMALL) / self.min_rate

    def bound(self, size: int | None = None) -> float:
        """Seconds after which a request moving ``size`` bytes to or from a store that
        stopped answering has raised RemoteError (90 s + 2 s by default)."""
        return self.deadline + self.try_limit(size)

    def delays(self, rng: random.Random) -> Iterator[float]:
        """The waits before each retry: full jitter over an exponential ceiling."""
        ceiling = self.first_backoff
        while True:
            yield rng.uniform(0, ceiling)
            ceiling = min(self.max_backoff, ceiling * 2)

    def run(self, attempt: Callable[[float], T], *, what: str, url: str,
            size: int | None = None) -> T:
        """``attempt(limit)`` (``limit``: :meth:`try_limit` seconds, for the client to
        cancel the try after), tried again on a transient error while the policy allows;
        :class:`RemoteError` (naming ``what`` and ``url``, raised from the last error)
        once it does not."""
        started, limit = time.monotonic(), self.try_limit(size)
        for tries, delay in enumerate(self.delays(random.Random()), start=1):
            try:
                return attempt(limit)
            except Exception as e:  # noqa: BLE001 - classified right here
                if not is_transient(e):
                    raise
                last = e
            waited = time.monotonic() - started
            if tries >= self.attempts or waited + delay >= self.deadline:
                raise self.error(what, url, tries, waited, last) from last
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - delays() never ends

    def error(self, what: str, url: str, tries: int, waited: float,
              last: BaseException) -> RemoteError:
        return RemoteError(
            f"{what} {url}: the store failed {tries} tr{'y' if tries == 1 else 'ies'} in "
            f"{waited:.1f} s (last: {type(last).__name__}: {_said(last)}); expected "
            f"an answer within {self.read_timeout:g} s per try. Check that the store is "
            f"up and reachable from here; on a slow or busy store raise "
            f"RemotePolicy(read_timeout=…, deadline=…) (now {self.deadline:g} s)",
            url=url)

    def s3fs_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` for s3fs with this policy's timeouts and botocore's retries off
        (what the caller set explicitly stays)."""
        out = dict(options)
        config = dict(out.get("config_kwargs") or {})
        config.setdefault("connect_timeout", self.connect_timeout)
        config.setdefault("read_timeout", self.read_timeout)
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        out["config_kwargs"] = config
        return out

    @staticmethod
    def quiet_client_retries(fs: Any) -> None:
        """Switch off s3fs's own retry loop on ``fs`` (an attribute, not an option)."""
        if type(fs).__name__ == "S3FileSystem":
            fs.retries = 1


DEFAULT_POLICY = RemotePolicy()
