"""The fault policy's rules (shardwise.remote.policy) on real errors, and expiring
credentials refreshed by botocore's own provider chain against the real S3 server."""

from __future__ import annotations

import pickle
import sys
import time
from pathlib import Path

import pytest

from shardwise.bench.seaweed import FAKE_ENV, S3Server
from shardwise.errors import ConfigError, RemoteError
from shardwise.remote import RemotePolicy, RemoteStore, is_transient

QUICK = RemotePolicy(attempts=4, first_backoff=0.001, max_backoff=0.002, deadline=5)


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def test_what_is_worth_another_try() -> None:
    from aiohttp import ClientPayloadError
    from botocore.exceptions import ReadTimeoutError

    transient = [_client_error("SlowDown", 503), _client_error("InternalError", 500),
                 _client_error("Throttling", 400), _client_error("x", 429),
                 ConnectionResetError(104, "reset"), ReadTimeoutError(endpoint_url="u"),
                 ClientPayloadError("Response payload is not completed")]
    wrapped = OSError("translated")  # as s3fs translates a botocore error
    wrapped.__cause__ = _client_error("SlowDown", 503)
    for e in [*transient, wrapped]:
        assert is_transient(e), e
    for e in [FileNotFoundError("k"), PermissionError("denied"),
              _client_error("AccessDenied", 403), _client_error("NoSuchBucket", 404),
              ValueError("bad"), RemoteError("given up")]:
        assert not is_transient(e), e


def test_run_retries_transient_errors_and_gives_up_with_remote_error() -> None:
    calls: list[float] = []

    def flaky(limit: float) -> str:
        calls.append(limit)
        if len(calls) < 3:
            raise _client_error("SlowDown", 503)
        return "ok"

    assert QUICK.run(flaky, what="GET", url="s3://b/k") == "ok" and len(calls) == 3
    assert calls[0] == QUICK.try_limit()

    def never(limit: float) -> str:
        raise ConnectionResetError(104, "reset")

    with pytest.raises(RemoteError, match=r"GET s3://b/k: the store failed 4 tries") as e:
        QUICK.run(never, what="GET", url="s3://b/k")
    assert e.value.url == "s3://b/k" and isinstance(e.value.__cause__, ConnectionResetError)
    again = pickle.loads(pickle.dumps(e.value))  # as a DataLoader worker sends it
    assert isinstance(again, RemoteError) and again.url == "s3://b/k"

    def missing(limit: float) -> str:
        calls.append(limit)
        raise FileNotFoundError("s3://b/k")

    calls.clear()
    with pytest.raises(FileNotFoundError):
        QUICK.run(missing, what="GET", url="s3://b/k")
    assert len(calls) == 1  # never retried


def test_the_deadline_bounds_the_retries() -> None:
    policy = RemotePolicy(attempts=10_000, first_backoff=0.05, max_backoff=0.05,
                          deadline=0.3)
    started = time.monotonic()
    with pytest.raises(RemoteError):
        policy.run(lambda t: (_ for _ in ()).throw(TimeoutError("t")), what="GET", url="u")
    assert 0.2 <= time.monotonic() - started < 1.0


def test_the_default_bound_is_under_two_minutes_and_options_are_checked() -> None:
    default = RemotePolicy()
    assert default.bound(8 << 20) <= default.bound(64 << 20) <= 120
    for bad in ({"read_timeout": 0}, {"deadline": -1}, {"attempts": 0},
                {"attempts": 1.5}, {"min_rate": float("inf")}):
        with pytest.raises(ConfigError, match="RemotePolicy"):
            RemotePolicy(**bad)  # type: ignore[arg-type]


def test_the_policy_travels_with_the_store() -> None:
    store = RemoteStore("s3://b/p", {"endpoint_url": "http://x"}, policy=QUICK)
    again = pickle.loads(pickle.dumps(store))
    assert again.policy == QUICK and again.storage_options == store.storage_options
    assert RemoteStore("s3://b/p").policy == RemotePolicy()
    opts = QUICK.s3fs_options({"config_kwargs": {"read_timeout": 99}})["config_kwargs"]
    assert opts == {"read_timeout": 99, "connect_timeout": QUICK.connect_timeout,
                    "retries": {"total_max_attempts": 1, "mode": "standard"}}


def test_the_environment_sets_the_policy_of_stores_made_without_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``SHARDWISE_REMOTE_POLICY`` reaches every store a run makes itself (a build's
    writers and sources, in every worker process); an explicit policy wins."""
    from shardwise.remote.policy import POLICY_ENV

    monkeypatch.setenv(POLICY_ENV, " read_timeout=2, deadline=7 ,attempts=3")
    want = RemotePolicy(read_timeout=2, deadline=7, attempts=3)
    assert RemotePolicy.from_env() == want == RemoteStore("s3://b/p").policy
    assert RemoteStore("s3://b/p", policy=QUICK).policy == QUICK
    for bad, why in (("deadlin=2", "is not name=number"), ("deadline", "is not name="),
                     ("deadline=x", "is not name="), ("attempts=1.5", "is not name="),
                     ("deadline=-1", "deadline must be a positive")):
        monkeypatch.setenv(POLICY_ENV, bad)
        with pytest.raises(ConfigError, match=f"{POLICY_ENV}=.*{why}"):
            RemoteStore("s3://b/p")
    monkeypatch.setenv(POLICY_ENV, "")
    assert RemotePolicy.from_env() == RemotePolicy()


def test_expiring_credentials_are_refreshed_by_the_provider_chain(
        s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key in the environment or the options: a profile's ``credential_process``
    hands out credentials that expire in 5 minutes (inside botocore's refresh window), so
    botocore asks it again as requests go on — shardwise does nothing for it."""
    bucket = s3_server.make_bucket("sw-creds").removeprefix("s3://")
    counter = tmp_path / "issued"
    script = tmp_path / "creds.py"
    script.write_text(
        "import datetime, json, pathlib\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "p.write_text(str(int(p.read_text() or 0) + 1) if p.exists() else '1')\n"
        "exp = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)\n"
        f"print(json.dumps({{'Version': 1, 'AccessKeyId': {FAKE_ENV['AWS_ACCESS_KEY_ID']!r},"
        f" 'SecretAccessKey': {FAKE_ENV['AWS_SECRET_ACCESS_KEY']!r},"
        " 'Expiration': exp.isoformat()}))\n")
    config = tmp_path / "aws-config"
    config.write_text(f"[profile expiring]\ncredential_process = {sys.executable} {script}\n"
                      "region = us-east-1\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "expiring")
    store = RemoteStore(f"s3://{bucket}/p", {"skip_instance_cache": True})
    store.put("a", b"x" * 10)
    for _ in range(3):
        assert store.get("a") == b"x" * 10
    assert int(counter.read_text()) >= 2, "the expiring credentials were never refreshed"
