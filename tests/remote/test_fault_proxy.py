"""The fault-injecting proxy itself (tests/faults.py), seen by a plain HTTP client
through presigned URLs: each mode produces exactly its symptom, rules change at run time,
and ``hits`` counts what was applied."""

from __future__ import annotations

import http.client
import socket
import urllib.parse

import pytest
from tests.faults import Fault, FaultProxy

from shardwise.bench.seaweed import FAKE_ENV, S3Server
from shardwise.errors import ConfigError

BUCKET = "sw-faults-proxy"
DATA = bytes(range(256)) * 1024  # 256 KiB


@pytest.fixture(scope="module")
def obj(s3_server: S3Server) -> str:
    import s3fs

    s3_server.make_bucket(BUCKET)
    s3fs.S3FileSystem(endpoint_url=s3_server.endpoint, skip_instance_cache=True).pipe_file(
        f"{BUCKET}/k.bin", DATA)
    return "k.bin"


def _get(proxy: FaultProxy, key: str, timeout: float = 10) -> tuple[int, bytes]:
    """One presigned GET through the proxy: (status, body)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=proxy.endpoint, region_name="us-east-1",
                      aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"])
    url = urllib.parse.urlsplit(s3.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": key}))
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    try:
        conn.request("GET", f"{url.path}?{url.query}")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_without_a_fault_the_bytes_pass_unchanged(fault_proxy: FaultProxy, obj: str) -> None:
    assert _get(fault_proxy, obj) == (200, DATA)
    assert fault_proxy.requests == 1 and not fault_proxy.hits


def test_flip_changes_exactly_one_bit(fault_proxy: FaultProxy, obj: str) -> None:
    fault_proxy.inject(Fault("flip"))
    status, body = _get(fault_proxy, obj)
    assert status == 200 and len(body) == len(DATA)
    diff = [(i, a ^ b) for i, (a, b) in enumerate(zip(body, DATA, strict=True)) if a != b]
    assert diff == [(len(DATA) // 2, 1)]
    assert fault_proxy.hits["flip"] == 1


def test_short_sends_half_the_promised_body_then_closes(fault_proxy: FaultProxy,
                                                        obj: str) -> None:
    fault_proxy.inject(Fault("short"))
    with pytest.raises(http.client.IncompleteRead) as e:
        _get(fault_proxy, obj)
    assert len(e.value.partial) == len(DATA) // 2 and e.value.partial == DATA[:len(DATA) // 2]


def test_reset_cuts_the_body_with_a_tcp_reset(fault_proxy: FaultProxy, obj: str) -> None:
    fault_proxy.inject(Fault("reset"))
    with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
        _get(fault_proxy, obj)
    assert fault_proxy.hits["reset"] == 1


def test_slowdown_answers_503_without_asking_the_server(fault_proxy: FaultProxy,
                                                        obj: str) -> None:
    fault_proxy.inject(Fault("slowdown", times=2))
    for _ in range(2):
        status, body = _get(fault_proxy, obj)
        assert status == 503 and b"<Code>SlowDown</Code>" in body
    assert _get(fault_proxy, obj) == (200, DATA)  # `times` spent: the server answers again
    assert fault_proxy.hits["slowdown"] == 2


def test_stall_never_answers(fault_proxy: FaultProxy, obj: str) -> None:
    fault_proxy.inject(Fault("stall"))
    with pytest.raises(socket.timeout):
        _get(fault_proxy, obj, timeout=0.5)
    fault_proxy.clear()
    assert _get(fault_proxy, obj) == (200, DATA)  # a new connection is served again


def test_hold_keeps_a_request_until_another_comes(fault_proxy: FaultProxy, obj: str) -> None:
    """The held GET is answered, whole, only once a request matching ``until`` came."""
    from concurrent.futures import ThreadPoolExecutor

    from shardwise.concurrency import wait_until

    fault_proxy.inject(Fault("hold", match=r"k\.bin", until=r"^GET /release", times=1))
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(_get, fault_proxy, obj)
        wait_until(lambda: fault_proxy.hits["hold"] == 1, timeout=10, poll_interval=0.01,
                   what="the proxy to hold the GET")
        assert _get(fault_proxy, "nothing-here")[0] == 404  # not the release: still held
        assert not held.done() and fault_proxy.hits["released"] == 0
        conn = http.client.HTTPConnection("127.0.0.1", fault_proxy.port, timeout=10)
        conn.request("GET", "/release")  # whatever its answer: its request releases
        conn.getresponse().read()
        conn.close()
        assert held.result(timeout=10) == (200, DATA)
    assert fault_proxy.hits["released"] == 1


def test_rules_match_by_request_line_and_rate(fault_proxy: FaultProxy, obj: str) -> None:
    fault_proxy.inject(Fault("slowdown", match=r"^GET /nothing-like-this"))
    assert _get(fault_proxy, obj) == (200, DATA)
    fault_proxy.inject(Fault("slowdown", match=r"^GET .*k\.bin", rate=0.5))
    statuses = [_get(fault_proxy, obj)[0] for _ in range(30)]
    assert 0 < statuses.count(503) < 30 and statuses.count(503) == fault_proxy.hits["slowdown"]
    with pytest.raises(ConfigError, match="fault mode"):
        Fault("explode")
    with pytest.raises(ConfigError, match="rate"):
        Fault("flip", rate=2)
