"""``shardwise bench remote`` on a tiny cache: the report's shape and its bound on the local
copy (speed is what the bench itself reports), and the missing-extra message."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from shardwise.bench import remote as bench_remote
from shardwise.errors import ConfigError, MissingExtraError


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_remote.add_subparser(parser.add_subparsers(dest="bench"))
    return parser.parse_args(["remote", *argv])


def test_json_report_on_a_tiny_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    """SeaweedFS behind the bench's own latency + bandwidth proxy: every path reads the
    local path's batches (the bench checks), the levers are on where they should be, the
    ceiling and the CPU figures are measured, the local copy is bounded."""
    args = _parse("--tokens", "400000", "--chunk-mb", "0.1", "--seq-len", "64",
                  "--batches", "40", "--latency", "0.02", "--local-mb", "0.5", "--json",
                  "--tmp-dir", str(tmp_path))
    assert bench_remote.run(args) == 0  # it also checks every path read the same batches
    report = json.loads(capsys.readouterr().out)
    assert set(report["best"]) == {"local", "before", "remote_0ms", "remote"}
    assert set(report["ratios_vs_local"]) == {"before", "remote_0ms", "remote"}
    assert report["local_bytes"] == 512 << 10 and report["chunks"] == 8
    assert 0 < report["max_local_bytes"] <= report["local_bytes"]
    assert report["targets"]["bounded"]
    assert report["ceiling"]["bytes_per_s"] > 0 and report["ceiling"]["bytes"] == 800000
    remote, before = report["best"]["remote"], report["best"]["before"]
    assert remote["native"] and not before["native"]  # obstore vs s3fs
    assert remote["prefetch"]["ranged_reads"] > 0 and before["prefetch"]["ranged_reads"] == 0
    assert remote["first_batch_s"] > 0.02 and remote["examples_per_s"] > 0
    assert remote["received"] > 0 and remote["cpu_s_per_gib"] > 0
    assert remote["prefetch"]["fetch_s"] >= 0.01  # every request came 20 ms late
    assert not list((tmp_path / "shardwise-bench-remote").glob("node-*"))  # removed


def test_side_by_side_with_litdata_on_a_tiny_cache(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--peer litdata --compare-only``: shardwise and LitData read the same tokens from
    the same server through the same proxy, each in a fresh process; every figure of the
    table is there, counted by the proxy for both, beside the ceiling and a bare client."""
    args = _parse("--tokens", "400000", "--chunk-mb", "0.1", "--seq-len", "64",
                  "--batches", "20", "--step-batches", "10", "--latency", "0.02",
                  "--compare-only", "--peer", "litdata", "--json", "--tmp-dir", str(tmp_path))
    assert bench_remote.run(args) == 0
    side = json.loads(capsys.readouterr().out)["side_by_side"]
    assert set(side["readers"]) == {"shardwise", "litdata"}
    for name, r in side["readers"].items():
        assert r["requests"] > 0 and r["max_connections"] >= 1, name
        assert r["received"] >= 800_000 and r["rate"] > 0 and r["cpu_s_per_gib"] > 0, name
        # the download's share: the CPU off the reader's own thread (which makes batches)
        assert 0 <= r["off_main_s_per_gib"] <= r["cpu_s_per_gib"], name
        assert 0.02 < r["first_s"] <= r["to_n_s"] <= r["epoch_s"], name
        assert r["waits_10"] is not None and r["longest"] is not None, name
        assert r["tokens"] > 0.9 * 400_000, name  # a whole epoch, each in its own windows
    assert [c["bytes"] for c in side["ceilings"]] == [800_000, 800_000]
    assert side["bare_cpu_s_per_gib"] > 0 and side["concurrency"] >= 1
    assert not list((tmp_path / "shardwise-bench-remote").glob("peer-node-*"))  # removed


def test_side_by_side_through_dataloader_workers(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--workers 1 --compact``: both readers through one DataLoader worker (shardwise's
    batches compact, uint16 tokens as LitData's), each a whole epoch of the same tokens; the
    CPU per GiB is left out (a worker's CPU is not the reader process's), not misreported."""
    args = _parse("--tokens", "200000", "--chunk-mb", "0.1", "--seq-len", "64",
                  "--batches", "10", "--step-batches", "0", "--latency", "0.01",
                  "--workers", "1", "--compact", "--compare-only", "--peer", "litdata",
                  "--json", "--tmp-dir", str(tmp_path))
    assert bench_remote.run(args) == 0
    side = json.loads(capsys.readouterr().out)["side_by_side"]
    for name, r in side["readers"].items():
        assert r["received"] >= 400_000 and r["rate"] > 0, name
        assert r["cpu_s_per_gib"] is None and r["cpu_vs_bare"] is None, name
        assert r["tokens"] > 0.9 * 200_000, name
    with pytest.raises(ConfigError, match="--workers must be 0 or more"):
        bench_remote.run(_parse("--workers", "-1", "--tmp-dir", str(tmp_path)))


def test_a_missing_peer_is_named_before_anything_starts(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "litdata", None)  # import litdata fails
    args = _parse("--peer", "litdata", "--tmp-dir", str(tmp_path))
    with pytest.raises(MissingExtraError, match=r"--peer litdata needs LitData.*pip install"):
        bench_remote.run(args)
    assert not (tmp_path / "shardwise-bench-remote").exists()


def test_without_moto_it_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardwise.bench.moto import moto_server

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "moto" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"shardwise\[bench\]"), \
            moto_server(Path("/nonexistent/moto.log")):
        pass


def test_remote_open_counts_one_fetch_per_node(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``shardwise bench remote-open`` on a tiny cache: the requests the server's log
    counts, per node, against one process's."""
    from shardwise.bench import remote_open

    parser = argparse.ArgumentParser()
    remote_open.add_subparser(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["remote-open", "--processes", "4", "--nodes", "2", "--tokens",
                              "200000", "--chunks", "2", "--seq-len", "64", "--latency",
                              "0.01", "--json", "--tmp-dir", str(tmp_path)])
    assert remote_open.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["one_process_requests"] == 3  # manifest, ledger, index: one GET each
    assert [r["requests"] for r in report["rounds"]] == [3, 6]  # 4 processes, 2 nodes
    assert [r["fetchers"] for r in report["rounds"]] == [1, 2] and report["ok"]


def test_sigterm_stops_the_servers_the_bench_started(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) of a running ``bench remote`` is Ctrl-C: SeaweedFS and the
    proxies it started are stopped and it exits 130 (the default action left them)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    cmd = [sys.executable, "-c", "import sys; from shardwise.cli.main import main; "
           "sys.exit(main(sys.argv[1:]))", "bench", "remote", "--tokens", "400000",
           "--chunk-mb", "0.1", "--seq-len", "64", "--batches", "40000", "--repeat", "50",
           "--tmp-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, servers = time.monotonic() + 120, []
        while not servers and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            servers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                       if "weed" in p.name()]
        assert servers, "the bench never started SeaweedFS"
        time.sleep(1.0)  # the rounds are running
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert b"interrupted" in err
    gone, alive = psutil.wait_procs(servers, timeout=15)
    assert not alive, alive
