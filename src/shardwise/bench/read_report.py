"""The report of ``shardwise bench read``: each figure beside its baseline (as a ratio), the
project's targets checked against the run, and the text form of both."""

from __future__ import annotations

from typing import Any

from shardwise.bench.read_data import VOCAB

TARGETS = {"loader_vs_megatron": 5.0, "loader_vs_numpy": 0.5, "first_example_s": 0.050,
           "import_s": 0.3, "seek_s": 0.010, "checks_vs_trusted": 0.9, "doc_vs_window": 0.7}
CHUNKED = "_chunked"
TRUSTED = "_chunked_trusted"
DOC = "_doc"
NUMPY = "plain numpy memmap slicing"
MEGATRON = "Megatron GPTDataset + DataLoader"


def _row(what: str, value: float | None, unit: str, base_what: str, base: float | None
         ) -> dict[str, Any]:
    ratio = value / base if value is not None and base else None
    return {"what": what, "value": value, "unit": unit, "baseline_what": base_what,
            "baseline": base, "ratio": ratio}


def _heap_growth(r: dict[str, Any]) -> float:
    """RssAnon after reading minus RssAnon after the imports (what the reader added)."""
    return float(r["anon_mb"] - r["after_import"]["anon_mb"])


def _sizes(rep: dict[str, Any]) -> tuple[str, str]:
    cfg = rep["config"]
    return f"{cfg['tokens'] / 1e6:g}M", f"{cfg['large_tokens'] / 1e6:g}M"


def _throughput_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The read paths of the one-``.bin`` corpus: vs plain numpy, Megatron, each other."""
    eps = {k: v["examples_per_s"] for k, v in rep["throughput"].items()}
    meg = eps.get("megatron")
    rows = [_row("ds[i], one example per call", eps["getitem"], "ex/s", NUMPY, eps["numpy"]),
            _row("ds.__getitems__, one micro-batch", eps["getitems"], "ex/s", NUMPY,
                 eps["numpy"])]
    if "loader" in eps:
        rows += [_row("loader, num_workers=0", eps["loader"], "ex/s", NUMPY, eps["numpy"]),
                 _row("loader, num_workers=0", eps["loader"], "ex/s", MEGATRON, meg)]
    if "getitems" + DOC in eps:
        rows.append(_row("__getitems__, doc shuffle", eps["getitems" + DOC], "ex/s",
                         "__getitems__, window shuffle", eps["getitems"]))
    if "loader" + DOC in eps:
        rows += [_row("loader, doc shuffle", eps["loader" + DOC], "ex/s",
                      "loader, window shuffle", eps["loader"]),
                 _row("loader, doc shuffle", eps["loader" + DOC], "ex/s", MEGATRON, meg)]
    if meg is not None:
        rows.append(_row(MEGATRON, meg, "ex/s", NUMPY, eps["numpy"]))
    return rows


def _check_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunked cache, with and without the integrity checks, and their one-time cost."""
    eps = {k: v["examples_per_s"] for k, v in rep["throughput"].items()}
    chunks = rep["data"].get("chunked", {}).get("chunks")
    rows = [_row(f"{path}, cache of {chunks} chunks", eps[path + CHUNKED], "ex/s",
                 f"{path}, one .bin", eps[path])
            for path in ("getitems", "loader") if path + CHUNKED in eps]
    rows += [_row(f"{path}, {chunks} chunks, checks on", eps[path + CHUNKED], "ex/s",
                  "the same, verify=False", eps[path + TRUSTED])
             for path in ("getitems", "loader") if path + TRUSTED in eps]
    if "first_epoch" in rep:
        fe = rep["first_epoch"]
        rows.append(_row(f"first epoch, {chunks} chunks, checks on + hashing", fe["examples"]
                         / fe["checks"], "ex/s", "the same, verify=False",
                         fe["examples"] / fe["trusted"]))
    if "verify_once" in rep:
        v = rep["verify_once"]
        rows.append(_row(f"checksum check, {v['chunks']} chunks, {v['bytes'] / 1e6:,.0f} MB",
                         v["mb_per_s"], "MB/s", "once per node, background thread", None))
    return rows


def _startup_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Import, first example (window shuffle; document shuffle cold and cached), seek."""
    st = rep["startup"]
    small, large = _sizes(rep)
    rows = [_row("import shardwise (fresh process)", st["import"]["seconds"], "s",
                 "import numpy", st["import_numpy"]["seconds"]),
            _row(f"first example, {small} tokens", st["first_small"]["seconds"], "s",
                 "np.memmap + first window", st["first_numpy_small"]["seconds"]),
            _row(f"first example, {large} tokens", st["first_large"]["seconds"], "s",
                 f"first example, {small} tokens", st["first_small"]["seconds"])]
    for size, name in ((small, "small"), (large, "large")):
        for plan in ("cold", "cached"):
            meg_first = st.get(f"megatron_{plan}_{name}", {}).get("seconds")
            rows.append(_row(f"first example, doc shuffle, {plan} plan, {size}",
                             st[f"doc_{plan}_{name}"]["seconds"], "s",
                             f"Megatron GPTDataset, {plan} index", meg_first))
    if "seek" in rep:
        rows.append(_row(f"loader + first batch at example {rep['seek']['consumed']:,}",
                         rep["seek"]["deep"], "s", "at example 0", rep["seek"]["zero"]))
    return rows


def _rss_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Peak RSS and heap of the reader vs plain numpy, and as the corpus grows."""
    rss = rep["rss"]
    small, large = _sizes(rep)
    rows = []
    for kind, key in (("peak RSS", "peak_mb"), ("heap (RssAnon)", "anon_mb")):
        if key not in rss["small"]:
            continue
        rows += [_row(f"{kind}, {small} tokens", rss["small"][key], "MB",
                      "plain numpy, same windows", rss["numpy_small"][key]),
                 _row(f"{kind}, {large} tokens", rss["large"][key], "MB",
                      "plain numpy, same windows", rss["numpy_large"][key]),
                 _row(f"{kind}, {large} vs {small} tokens", rss["large"][key], "MB",
                      f"{kind}, {small} tokens", rss["small"][key])]
    if "anon_mb" in rss.get("megatron_small", {}):
        rows += [_row(f"heap growth while reading, {size} tokens", _heap_growth(rss[name]),
                      "MB", "Megatron GPTDataset, as many",
                      _heap_growth(rss[f"megatron_{name}"]))
                 for size, name in ((small, "small"), (large, "large"))]
    return rows


def figure_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure beside its baseline (ratio = figure / baseline)."""
    return _throughput_rows(rep) + _check_rows(rep) + _startup_rows(rep) + _rss_rows(rep)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def targets(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's acceptance figures, checked against this run (None: not measured)."""
    tp, st, t = rep["throughput"], rep["startup"], TARGETS
    eps = {k: v["examples_per_s"] for k, v in tp.items()}
    loader = eps.get("loader")
    first = max(st[k]["seconds"] for k in ("first_small", "first_large", "doc_cached_small",
                                           "doc_cached_large"))
    out = [
        {"what": f"loader >= {t['loader_vs_megatron']:g}x Megatron GPTDataset", "op": ">=",
         "want": t["loader_vs_megatron"], "got": _ratio(loader, eps.get("megatron"))},
        {"what": f"loader >= {t['loader_vs_numpy']:.0%} of plain numpy", "op": ">=",
         "want": t["loader_vs_numpy"], "got": _ratio(loader, eps["numpy"])},
        {"what": f"first example < {t['first_example_s'] * 1e3:g} ms, both sizes, window "
                 "shuffle and cached document plan", "op": "<",
         "want": t["first_example_s"], "got": first},
        {"what": f"import shardwise < {t['import_s']:g} s", "op": "<", "want": t["import_s"],
         "got": st["import"]["seconds"]},
        {"what": f"seek < {t['seek_s'] * 1e3:g} ms", "op": "<", "want": t["seek_s"],
         "got": rep["seek"]["deep"] if "seek" in rep else None},
        {"what": f"loader with checks >= {t['checks_vs_trusted']:.0%} of verify=False "
                 "(chunked cache)", "op": ">=", "want": t["checks_vs_trusted"],
         "got": _ratio(eps.get("loader" + CHUNKED), eps.get("loader" + TRUSTED))},
        {"what": f"document shuffle >= {t['doc_vs_window']:g}x window path (loader)",
         "op": ">=", "want": t["doc_vs_window"],
         "got": _ratio(eps.get("loader" + DOC), loader)},
    ]
    for x in out:
        got = x["got"]
        x["ok"] = None if got is None else (got >= x["want"] if x["op"] == ">=" else
                                            got < x["want"])
    return out


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ex/s":
        return f"{value:,.0f} ex/s"
    if unit == "s":
        return f"{value * 1e3:,.1f} ms"
    return f"{value:,.1f} {unit}"


def format_report(rep: dict[str, Any]) -> str:
    """The report as text: a header, the rows, the identity check, the targets."""
    cfg, data = rep["config"], rep["data"]
    tp = rep["throughput"]
    lines = [
        f"shardwise bench read: Megatron .bin/.idx of {cfg['tokens']:,} tokens "
        f"({data['small']['documents']:,} documents, mean {data['small']['mean_doc']:.0f}) "
        f"and {cfg['large_tokens']:,}; uint16, vocab {VOCAB:,}",
        f"  seq_len {cfg['seq_len']}, micro-batch {cfg['micro_batch']}, window shuffle "
        f"unless named, one process; {cfg['batches']} micro-batches per run, best of "
        f"{cfg['repeat']}, {cfg['clock']} clock",
        "",
        f"  {'figure':<44}{'value':>16}   {'baseline':<34}{'value':>16}{'ratio':>9}",
    ]
    for r in rep["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"  {r['what']:<44}{_fmt(r['value'], r['unit']):>16}   "
                     f"{r['baseline_what']:<34}{_fmt(r['baseline'], r['unit']):>16}"
                     f"{ratio:>9}")
    if "loader" in tp:
        lo = tp["loader"]
        lines.append(f"  loader: {lo['batches_per_s']:,.0f} micro-batches/s, "
                     f"{lo['tokens_per_s'] / 1e6:,.1f} M tokens/s")
    lines += [f"  note: {n}" for n in rep["notes"]]
    ident = rep["identical"]
    lines += ["", f"  identical to plain numpy ({ident['batches']} micro-batches): "
                  + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ident.items()
                              if k not in ("batches", "all") and v is not None)]
    for tg in rep["targets"]:
        got = tg["got"]
        status = "not measured" if got is None else ("ok" if tg["ok"] else "MISSED")
        shown = "-" if got is None else (f"{got:.2f}x" if tg["op"] == ">=" else
                                         f"{got * 1e3:.1f} ms")
        lines.append(f"  target {tg['what']}: {shown} {status}")
    return "\n".join(lines)
