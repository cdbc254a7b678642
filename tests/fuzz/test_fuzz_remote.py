"""The fuzz cases of test_fuzz_cache.py through a bucket (the session's SeaweedFS), a
smaller set: the damaged cache uploaded, read by the readers through ``open_cache(url)``,
and ``verify s3://…`` reporting exactly what local ``verify`` reports of the same bytes
(one verify for both: issue 27, finding 4)."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.fuzz.conftest import examples
from tests.fuzz.harness import (
    CASE_SECONDS,
    Case,
    Clean,
    check_reads,
    stream_examples,
    summary,
    token_examples,
    within,
)
from tests.fuzz.mutations import any_edit, byte_edit
from tests.fuzz.test_fuzz_cache import CHUNK_IDX, CHUNK_META, reseal

from shardwise.bench.seaweed import S3Server
from shardwise.format.ledger import LEDGER_NAME
from shardwise.format.ledger_index import INDEX_NAME
from shardwise.format.manifest import MANIFEST_NAME
from shardwise.format.megatron import HEADER_SIZE
from shardwise.storage.verify import verify_cache

BUCKET = "sw-fuzz"
TARGETS = [MANIFEST_NAME, LEDGER_NAME, INDEX_NAME, CHUNK_META[0], CHUNK_IDX[0]]
REMOTE_READERS = {"TokenDataset": token_examples, "StreamDataset": stream_examples,
                  "inspect": summary}


def upload(root: Path) -> str:
    url = f"s3://{BUCKET}/fuzz-{os.getpid()}-{os.urandom(4).hex()}"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith(".shardwise-plans"):
            fs.pipe_file(f"{url[5:]}/{rel}", p.read_bytes())
    return url


@settings(**examples(8))  # type: ignore[arg-type]
@given(data=st.data(), target=st.sampled_from(TARGETS), seal=st.booleans())
def test_a_damaged_remote_cache_is_read_clean_or_named(s3_server: S3Server, finished: Clean,
                                                       data: st.DataObject, target: str,
                                                       seal: bool) -> None:
    s3_server.make_bucket(BUCKET)
    edit = data.draw(byte_edit(head=HEADER_SIZE) if target.endswith(".idx") else any_edit())
    case = Case.of(finished.root)
    try:
        path = case.cache / target
        path.write_bytes(edit(path.read_bytes()))
        if seal:
            reseal(case.cache, target)
        url = upload(case.cache)

        def body() -> None:
            check_reads(finished, url, url, f"{target} damaged", REMOTE_READERS,
                        local_dir=case.dir / "node")
            local, remote = verify_cache(case.cache), verify_cache(url)
            assert sorted((p.path.replace(url, str(case.cache)), p.what)
                          for p in remote.problems) == sorted(
                (p.path, p.what) for p in local.problems)
        within(CASE_SECONDS, body)
        leftover = set(os.listdir(case.dir)) - {"node"}
        assert leftover == {"cache", "sibling"}, leftover
    finally:
        case.close()
