"""Expiring credentials across a long read (issue 21 item 4): the client's own provider
chain refreshes them.

A reader process (a loader with a DataLoader worker) gets no keys in its environment, only
an AWS profile whose ``credential_process`` hands out credentials that expire within the
minute: botocore's chain then runs the process again before the requests that need fresh
ones. The read must return the same tokens as the local build, and the provider must have
been asked again by a process that downloads: credentials taken once and passed on as
fixed keys (to a worker, or to another client) would be used after their expiry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import shardwise as sw
from shardwise.bench.seaweed import FAKE_ENV, S3Server

PROVIDER = textwrap.dedent("""
    import datetime, json, os, sys
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getppid()}\\n")
    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
    print(json.dumps({"Version": 1, "AccessKeyId": %r, "SecretAccessKey": %r,
                      "Expiration": soon.strftime("%%Y-%%m-%%dT%%H:%%M:%%SZ")}))
""") % (FAKE_ENV["AWS_ACCESS_KEY_ID"], FAKE_ENV["AWS_SECRET_ACCESS_KEY"])

READER = textwrap.dedent("""
    import itertools, sys
    import numpy as np
    import shardwise as sw
    from shardwise.torch import loader
    url, local, out = sys.argv[1:4]
    cache = sw.open_cache(url, local_dir=local, local_bytes=64 << 20)
    ds = sw.TokenDataset(cache, seq_len=16, shuffle="none")
    dl = loader(ds, global_batch_size=4, micro_batch_size=4, world=sw.World(0, 1),
                num_workers=1)
    epoch = itertools.islice(dl, len(ds) // 4)  # the loader goes on into the next epochs
    rows = np.concatenate([b["input_ids"].numpy().copy() for b in epoch])
    np.save(out, rows)
""")


@pytest.fixture(scope="module")
def cache_url(s3_server: S3Server, sample_corpus: Path, tokenizer_path: Path,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    url = s3_server.make_bucket("sw-credentials") + "/cache"
    local = tmp_path_factory.mktemp("credentials") / "cache"
    for out in (url, str(local)):
        sw.build([str(sample_corpus)], out, tokenizer=tokenizer_path, chunk_docs=64,
                 append_eod=True, progress=False, workers=1)
    return url, local


def test_expiring_credentials_are_refreshed_by_the_provider_chain(
        cache_url: tuple[str, Path], s3_server: S3Server, tmp_path: Path) -> None:
    url, local = cache_url
    provider, calls = tmp_path / "provider.py", tmp_path / "calls"
    provider.write_text(PROVIDER)
    config = tmp_path / "aws_config"
    config.write_text(f"[profile expiring]\ncredential_process = {sys.executable} "
                      f"{provider} {calls}\nregion = us-east-1\n")
    (tmp_path / "reader.py").write_text(READER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    env.update(AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_PROFILE="expiring", AWS_ENDPOINT_URL=s3_server.endpoint,
               PYTHONPATH=os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")]))
    out = tmp_path / "rows.npy"
    done = subprocess.run([sys.executable, str(tmp_path / "reader.py"), url,
                           str(tmp_path / "node"), str(out)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    expected = sw.TokenDataset(sw.open_cache(local), seq_len=16, shuffle="none")
    rows = np.load(out)
    assert len(rows) == len(expected) // 4 * 4
    np.testing.assert_array_equal(rows, np.stack([expected[i]["input_ids"]
                                                  for i in range(len(rows))]))
    per_process: dict[str, int] = {}
    for pid in calls.read_text().split():
        per_process[pid] = per_process.get(pid, 0) + 1
    assert max(per_process.values()) > 1, (
        f"each process asked the provider once ({json.dumps(per_process)}): expiring "
        "credentials were not refreshed")
