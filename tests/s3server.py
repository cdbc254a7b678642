"""A real S3 server for the tests: SeaweedFS (``weed mini``: the package's
:mod:`shardwise.bench.seaweed`, which ``bench remote`` starts too) on 127.0.0.1, one per
test session (the ``s3_server`` fixture in tests/conftest.py).

Every port is picked free; the data lives in a temporary directory; the credentials are
fake and given to SeaweedFS in an S3 config file, and to the clients (fsspec/boto, obstore)
only through the standard environment variables (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``…), as they would be in production: the fixture sets them for the
session, so DataLoader workers and subprocesses inherit them. A test that needs another
endpoint (e.g. a proxy in front of the server) passes
``storage_options={"endpoint_url": …}``.

``moto_s3`` (moto's in-process server) stays for what SeaweedFS lacks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from shardwise.bench.seaweed import FAKE_ENV, S3Server, _fs, free_ports, seaweed_s3  # noqa: F401

__all__ = ["FAKE_ENV", "S3Server", "free_ports", "moto_s3", "s3_environment", "seaweed_s3"]


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


@contextmanager
def moto_s3(bucket: str) -> Iterator[dict[str, str]]:
    """moto on a free port with ``bucket``; yield the env a client needs (for what
    SeaweedFS lacks)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with s3_environment(dict(FAKE_ENV, AWS_ENDPOINT_URL=f"http://{host}:{port}")) as env:
            with suppress(FileExistsError):
                _fs(env["AWS_ENDPOINT_URL"]).mkdir(bucket)
            yield env
    finally:
        server.stop()

