"""The hostile ledgers of tests/format/test_hostile_ledger.py, through a bucket (the
session's SeaweedFS): ``verify s3://…`` finds what local ``verify`` finds (it read the
snapshot only, not the journal, and said OK: issue 27, finding 4), and readers refuse them
as they do locally."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import fsspec
import pytest
from tests.format.test_hostile_ledger import HOSTILE, clean  # noqa: F401  (a fixture)
from tests.remote.conftest import BUCKET

import shardwise as sw
from shardwise.errors import ManifestError
from shardwise.format.ledger import LEDGER_NAME
from shardwise.storage.verify import verify_cache


def upload(root: Path) -> str:
    """Every file of cache directory ``root`` to a new prefix of the bucket; its URL."""
    url = f"s3://{BUCKET}/hostile-{os.getpid()}-{os.urandom(3).hex()}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            fs.pipe_file(f"{url[5:]}/{p.relative_to(root).as_posix()}", p.read_bytes())
    return url


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_remote_verify_and_readers_refuse_what_local_verify_does(
        s3_env: dict[str, str], clean: Path, tmp_path: Path, case: str) -> None:  # noqa: F811
    edit, message = HOSTILE[case]
    root = Path(shutil.copytree(clean, tmp_path / "c"))
    edit(root)
    url = upload(root)
    local, remote = verify_cache(root), verify_cache(url)
    assert not remote.ok
    assert sorted((p.path.replace(url, str(root)), p.what) for p in remote.problems) == \
        sorted((p.path, p.what) for p in local.problems)
    assert any(p.path == f"{url}/{LEDGER_NAME}" for p in remote.problems)
    with pytest.raises(ManifestError, match=message):
        sw.open_cache(url, local_dir=tmp_path / "node")


def test_a_clean_cache_verifies_the_same_through_a_bucket(
        s3_env: dict[str, str], clean: Path) -> None:  # noqa: F811
    url = upload(clean)
    local, remote = verify_cache(clean), verify_cache(url)
    assert local.ok and remote.ok
    assert (remote.chunks_checked, remote.bytes_checked) == (local.chunks_checked,
                                                            local.bytes_checked)
