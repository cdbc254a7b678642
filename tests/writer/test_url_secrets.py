"""A URL's secrets are never stored, printed or put in a state: a build from
``http://user:pass@host/…`` (a real HTTP server that requires those credentials) reads
with them and writes none of them — not in any file of the cache, not in what ``build``,
``inspect``, ``trace`` and ``verify`` print, not in a loader's state, not in an error."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import write_jsonl

import shardwise as sw
from shardwise.errors import ShardwiseError
from shardwise.format.paths import redact_url
from shardwise.remote.client import RemoteStore
from shardwise.torch import loader
from shardwise.world import World

SECRET = "pa55-s3cret-w0rd"
TEXTS = [f"document {i}: " + "the quick brown fox jumps over the lazy dog " * (i % 5 + 1)
         for i in range(60)]


class _Auth(http.server.SimpleHTTPRequestHandler):
    """Serves a directory to ``user:SECRET`` only (401 otherwise)."""

    def _allowed(self) -> bool:
        want = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
        if self.headers.get("Authorization") == want:
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", "Basic")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_GET(self) -> None:
        if self._allowed():
            super().do_GET()

    def do_HEAD(self) -> None:
        if self._allowed():
            super().do_HEAD()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` serving ``good.jsonl`` and ``bad.jsonl`` (line 3 is
    not JSON) with basic auth."""
    root = tmp_path_factory.mktemp("served")
    write_jsonl(root / "good.jsonl", TEXTS)
    (root / "bad.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{not json\n')
    handler = functools.partial(_Auth, directory=str(root))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()
    thread.join()


def _files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_build_reads_with_the_credentials_and_stores_none(
        server: str, tmp_path: Path, tokenizer_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    url = f"http://user:{SECRET}@{server}/good.jsonl"
    out = tmp_path / "cache"
    code, printed, err = cli("build", url, "--out", out, "--tokenizer", tokenizer_path)
    assert code == 0, err
    cache = sw.open_cache(out)
    assert cache.num_documents == len(TEXTS)  # read through the credentials
    assert cache.manifest is not None
    assert cache.manifest.sources[0].path == f"http://{server}/good.jsonl"
    ds = sw.TokenDataset(out, seq_len=16, seed=1)
    dl = loader(ds, global_batch_size=4, micro_batch_size=2, world=World(rank=0, size=1))
    for _, _ in zip(dl, range(3), strict=False):
        pass
    state = dl.state_dict()
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    for args in (("inspect", out), ("verify", out),
                 ("trace", state_path, "--cache", out, "--global-batch-size", 4,
                  "--micro-batch-size", 2, "--world-size", 1)):
        code, shown, err = cli(*args)
        assert code == 0, (args, err)
        printed += shown + err
    assert f"{server}/good.jsonl" in printed  # the source is named, without its secret
    assert SECRET not in printed
    assert SECRET not in json.dumps(state)
    assert _files_holding(out, SECRET) == []
    sw.build([url], out, tokenizer=tokenizer_path)  # a rerun with the same credentials resumes


def test_errors_name_the_url_without_its_credentials(server: str, tmp_path: Path,
                                                     tokenizer_path: Path) -> None:
    with pytest.raises(ShardwiseError) as bad:
        sw.build([f"http://user:{SECRET}@{server}/bad.jsonl"], tmp_path / "a",
                 tokenizer=tokenizer_path)
    assert f"http://{server}/bad.jsonl:3" in str(bad.value)
    wrong = "not-the-" + SECRET
    with pytest.raises(Exception) as refused:  # noqa: PT011  # 401: whatever names it
        sw.build([f"http://user:{wrong}@{server}/good.jsonl"], tmp_path / "b",
                 tokenizer=tokenizer_path)
    chain = [refused.value, *(e for e in (refused.value.__cause__, refused.value.__context__)
                              if e is not None)]
    assert not [str(e) for e in chain if wrong in str(e)]
    for root in (tmp_path / "a", tmp_path / "b"):
        assert not root.exists() or _files_holding(root, SECRET[3:]) == []


@pytest.mark.parametrize(("url", "shown"), [
    ("https://me:pw@host/a.jsonl", "https://host/a.jsonl"),
    ("https://host/a.jsonl?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F1&X-Amz-Signature=9f"
     "&X-Amz-Security-Token=tok", "https://host/a.jsonl?X-Amz-Algorithm=AWS4&X-Amz-Credential"
     "=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Security-Token=REDACTED"),
    ("https://acct.blob.core.windows.net/c/a.parquet?sv=2022&sig=abc%3D", "https://acct.blob"
     ".core.windows.net/c/a.parquet?sv=2022&sig=REDACTED"),
    ("https://storage.googleapis.com/b/o?X-Goog-Signature=ff&x=1",
     "https://storage.googleapis.com/b/o?X-Goog-Signature=REDACTED&x=1"),
    ("https://h/o?token=t&access_token=a&signature=s", "https://h/o?token=REDACTED&"
     "access_token=REDACTED&signature=REDACTED"),
    ("s3://bucket/cache", "s3://bucket/cache"),
    ("/data/a@b.jsonl", "/data/a@b.jsonl"),
])
def test_redact_url_strips_userinfo_and_signed_query_tokens(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown


def test_a_store_shows_its_url_without_credentials() -> None:
    store = RemoteStore(f"https://user:{SECRET}@host/cache?sig={SECRET}")
    shown = [str(store), repr(store), store.url, store.url_of("ledger.json")]
    assert not [s for s in shown if SECRET in s]
    assert SECRET in pickle.loads(pickle.dumps(store))._url  # to reach it from a worker
