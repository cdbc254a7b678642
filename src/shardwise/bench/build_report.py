"""The figures of ``shardwise bench build`` as a human report, and the project's targets
checked against them.

Why its own module: measuring (build.py) and presenting are separate; the JSON report is
the measurement, this module only reads it.
"""

from __future__ import annotations

from typing import Any

from shardwise.bench.text_corpus import MB
from shardwise.bench.tokenizer_baseline import BATCH

TARGET_VS_TOKENIZER = 0.8   # one worker vs the tokenizer alone, one thread
TARGET_EFFICIENCY = 0.8     # N workers vs N × one worker
TARGET_BUCKET = 0.8         # corpus and cache in a bucket vs on disk, same workers
BUSY_LOAD = 1.25            # load average per core above which the figures are suspect


def plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}{'es' if what.endswith('s') else 's'}"


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's acceptance figures, checked against this run."""
    builds = report["builds"]
    out = [{"what": f"bucket to bucket, {plural(b['workers'], 'worker')} >= "
                    f"{TARGET_BUCKET:.2f}x from and to disk (median of the rounds)",
            "want": TARGET_BUCKET, "got": b["vs_local_median"]}
           for b in report.get("bucket_builds", [])[-1:]]
    out += [{"what": f"1 worker >= {TARGET_VS_TOKENIZER:.2f}x the tokenizer's single thread",
            "want": TARGET_VS_TOKENIZER, "got": builds[0]["vs_tokenizer"]}]
    for b in builds[1:]:
        want = TARGET_EFFICIENCY * b["workers"]
        out.append({"what": f"{b['workers']} workers >= {want:.2f}x 1 worker", "want": want,
                    "got": b["vs_one_worker"]})
    for t in out:
        t["ok"] = t["got"] >= t["want"]
    return out


def _row(name: str, f: dict[str, Any], vs_one: float | None, vs_tok: float,
         vs_same: float | None) -> str:
    cells = [f"{x:.2f}x" if x is not None else "-" for x in (vs_one, vs_tok, vs_same)]
    return (f"  {name:<24}{f['seconds']:>8.2f}{f['cpu_seconds']:>8.2f}"
            f"{f['tokens_per_s'] / 1e6:>8.3f}{f['mb_per_s']:>7.2f}"
            f"{cells[0]:>13}{cells[1]:>14}{cells[2]:>12}")


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def _bucket_lines(report: dict[str, Any], on_ray: bool) -> list[str]:
    """The rows of ``--bucket``'s builds, and what they were compared with."""
    lines = [_row(f"bucket, {plural(b['workers'], 'worker')}", b, b["vs_one_worker"],
                  b["vs_tokenizer"], b["vs_tokenizer_same_count"]) + f"{b['vs_local']:>9.2f}x"
             for b in report.get("bucket_builds", [])]
    if lines:
        lines.append(f"  bucket: corpus and cache in {report['bucket']} "
                     f"({'on Ray' if on_ray else 'local executor'}); its vs local: its MB/s "
                     f"/ the {'Ray ' if on_ray else ''}build's from and to disk, same workers "
                     "(best run / best run); round by round:")
        for b in report["bucket_builds"]:
            lo, hi = b["vs_local_range"]
            lines.append(f"    {plural(b['workers'], 'worker')}: median "
                         f"{b['vs_local_median']:.2f}x "
                         f"(rounds {lo:.2f}x-{hi:.2f}x, taking turns to go first); by CPU "
                         f"seconds {b['vs_local_cpu_median']:.2f}x (median)")
    return lines


def format_report(report: dict[str, Any]) -> str:
    c, t, m = report["corpus"], report["tokenizer"], report["machine"]
    rays = report.get("ray_builds", [])
    lines = [
        f"shardwise bench build: {c['text_bytes'] / MB:.1f} MB of text in {c['documents']:,} "
        f"documents ({c['file_bytes'] / MB:.1f} MB of JSONL, {c['copies']} copies of "
        f"{c['source']}), {t['tokens']:,} tokens",
        f"  tokenizer {report['tokenizer_path']} ({t['model']}, vocab {t['vocab_size']:,}), "
        f"{t['method']} in batches of {BATCH}, 1 thread per process",
        f"  cores: {m['usable_cores']} usable of {m['cpu_count']} (load average "
        f"{_fmt(m['load_before'])} before, {_fmt(m['load_after'])} after); best of "
        f"{report['repeat']} interleaved runs each; MB = 10^6 bytes of text",
        "",
        f"  {'':<24}{'best s':>8}{'cpu s':>8}{'Mtok/s':>8}{'MB/s':>7}{'vs 1 worker':>13}"
        f"{'vs tokenizer':>14}{'vs tok x N':>12}"
        + (f"{'vs local':>10}" if rays or "bucket_builds" in report else ""),
        _row("tokenizer, 1 thread", t, None, 1.0, None),
    ]
    for p in report["tokenizer_parallel"]:
        lines.append(_row(f"tokenizer, {p['processes']} processes", p, None,
                          p["vs_one_thread"], None))
    for b in report["builds"]:
        lines.append(_row(f"build, {plural(b['workers'], 'worker')}", b, b["vs_one_worker"],
                          b["vs_tokenizer"], b["vs_tokenizer_same_count"]))
    for b in rays:
        lines.append(_row(f"ray, {plural(b['workers'], 'worker')}", b, b["vs_one_worker"],
                          b["vs_tokenizer"], b["vs_tokenizer_same_count"])
                     + f"{b['vs_local']:>9.2f}x")
    lines += _bucket_lines(report, bool(rays))
    if rays:
        r = report["ray"]
        lines.append(f"  ray {r['version']}: a local cluster of {r['cpus']} CPUs, started in "
                     f"{r['start_seconds']:.1f} s and warmed up before timing (not counted); "
                     "vs local: Ray's MB/s / the local build's with as many workers")
    n_builds = report["repeat"] * (len(report["builds"]) + len(rays)
                                   + len(report.get("bucket_builds", [])))
    lines += ["", f"  identical: {'yes' if report['identical'] else 'no'} "
                  f"({report['distinct_caches']} distinct cache(s) from {n_builds} builds)"]
    if not report["tokens_match"]:
        lines.append("  note: the builds and the tokenizer counted different numbers of tokens")
    for tg in report["targets"]:
        lines.append(f"  target {tg['what']}: {tg['got']:.2f}x {'ok' if tg['ok'] else 'MISSED'}")
    if report["machine"]["busy"]:
        lines.append(f"  warning: other work kept this machine busy (load average above "
                     f"{BUSY_LOAD:.1f} per core): wall-time figures are unreliable; compare "
                     "'cpu s', or run again when it is idle")
    return "\n".join(lines)


__all__ = ["BUSY_LOAD", "format_report", "plural", "targets"]
