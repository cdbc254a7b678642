"""moto's S3 server in a process of its own, for the benches that count requests in its
log (``bench remote-open``, ``bench ledger``'s bucket build); ``bench remote`` reads from
SeaweedFS (:mod:`shardwise.bench.seaweed`)."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardwise.concurrency import wait_until
from shardwise.errors import MissingExtraError

BUCKET = "shardwise-bench"
MOTO_INSTALL = "pip install 'shardwise[bench]'  (moto[server])"
KEYS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[int]:
    """A moto S3 server in a process of its own (its request log in ``log``: a pipe
    nobody reads would fill and stop the server); yields its port."""
    if importlib.util.find_spec("moto") is None:
        raise MissingExtraError(f"this bench needs moto's S3 server: {MOTO_INSTALL}")
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                 "-p", str(port)], stdout=out, stderr=out)
    try:
        wait_until(lambda: proc.poll() is not None or _listening(port), timeout=30,
                   poll_interval=0.1, what="the moto server")
        if proc.poll() is not None:
            raise MissingExtraError(f"moto's server did not start: "
                                    f"{log.read_text(errors='replace')[-1000:].strip()}; "
                                    f"{MOTO_INSTALL}")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def store_options(port: int) -> dict[str, Any]:
    return {"endpoint_url": f"http://127.0.0.1:{port}", "key": KEYS["aws_access_key_id"],
            "secret": KEYS["aws_secret_access_key"], "skip_instance_cache": True,
            "config_kwargs": {"read_timeout": 60,  # a lost answer fails, never hangs
                              "max_pool_connections": 32}}  # >= downloads at once


def upload(local: Path, url: str, options: dict[str, Any]) -> None:
    """Copy a finished local cache to ``url``: chunk files, then the manifest, then the
    ledger that names them (the order a build publishes in)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **options)
    if not fs.exists(root.split("/")[0]):
        fs.mkdir(root.split("/")[0])
    files = sorted(p for p in local.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(local).parts))
    last = {"manifest.json": 1, "ledger.json": 2}
    for p in sorted(files, key=lambda p: last.get(p.name, 0)):
        fs.pipe_file(f"{root}/{p.relative_to(local).as_posix()}", p.read_bytes())


__all__ = ["BUCKET", "moto_server", "store_options", "upload"]
