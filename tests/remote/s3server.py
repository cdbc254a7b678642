"""A local S3-compatible server (moto) on 127.0.0.1 for the object-storage tests.

Credentials are fake and reach fsspec/boto only through the standard environment
variables (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``…), as they would in production.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

FAKE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_s3(bucket: str) -> Iterator[dict[str, str]]:
    """Start moto on a free port, create ``bucket``; yield the env a client needs."""
    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = dict(FAKE_ENV, AWS_ENDPOINT_URL=f"http://{host}:{port}")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3 = type(fsspec.filesystem("s3", skip_instance_cache=True))
    s3.clear_instance_cache()  # a cached client would still point at an earlier server
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir(bucket)
        yield env
    finally:
        s3.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
