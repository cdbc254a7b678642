"""``shardwise trace``: what the model saw at a step — each example's rank, micro-batch,
documents, source files and lines; ``--plot`` the sources of a range of steps.

Thin shell over :class:`shardwise.read.trace.Tracer`. The input is a read config (JSON,
:mod:`shardwise.read.config`) or a saved state: a loader's ``state_dict()`` as JSON, a
checkpoint directory holding ``shardwise_loader.json`` (ShardwiseTrainer), or a torch
checkpoint file with the state somewhere inside (loaded with ``weights_only=True``: no
code runs). A state holds the order, not the paths or the batch layout: give ``--cache``
(or ``--blend name=path ...``) and the layout.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

import orjson

from shardwise.errors import ConfigError, StateError
from shardwise.read.config import ReadConfig, load_read_config
from shardwise.read.trace import StepTrace, Tracer
from shardwise.read.trace.plot import step_mix, svg_chart, terminal_chart

STATE_FILE = "shardwise_loader.json"  # what ShardwiseTrainer saves in a checkpoint
DESCRIPTION = ("List every example of a global step: the rank and micro-batch that read it "
               "and, for each document piece in it, the source file, line, document id and "
               "token offsets (--text decodes it with the cache's tokenizer). O(1) per "
               "example: nothing before the step is read. --plot draws which sources a "
               "range of steps drew from.")
EPILOG = """examples:
  shardwise trace read.json --step 48213
  shardwise trace read.json --step 48213 --text --tokenizer tokenizer.json
  shardwise trace read.json --examples 1000:1016 --json
  shardwise trace read.json --plot 0:500 --svg mix.svg
  shardwise trace ckpt/checkpoint-500 --cache cache/ --global-batch-size 64 \\
      --micro-batch-size 8 --world-size 4          (the last step before the checkpoint)"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "trace", help="which documents, by file and line, a training step read",
        description=textwrap.fill(DESCRIPTION, 88), epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="CONFIG|STATE", help="a read config (JSON), a saved "
                   "loader state (JSON), a checkpoint directory or a torch checkpoint file")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--step", type=int, help="the global step (default for a state: the "
                      "last step before it was saved)")
    what.add_argument("--examples", metavar="A:B", help="positions [A, B) of the global order")
    what.add_argument("--plot", metavar="A:B", help="chart the sources of steps [A, B)")
    p.add_argument("--svg", metavar="FILE", help="with --plot: also write the chart as SVG")
    p.add_argument("--text", action="store_true", help="decode each piece with the tokenizer")
    p.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json for --text (checked "
                   "against the cache's; default: the config's 'tokenizer')")
    p.add_argument("--json", action="store_true", help="print the trace as one JSON object")
    state = p.add_argument_group("with a state (the order is in it; these are not)")
    state.add_argument("--cache", metavar="DIR", help="the cache the run read")
    state.add_argument("--blend", nargs="+", metavar="NAME=DIR", help="a blend's caches")
    for name in ("global-batch-size", "micro-batch-size", "world-size", "seq-len"):
        state.add_argument(f"--{name}", type=int)
    state.add_argument("--set", nargs="+", default=[], metavar="KEY=JSON", help="any other "
                       "field a state lacks (a blend's holds no reader options), e.g. "
                       "shuffle='\"block\"'")
    return p


def run(args: argparse.Namespace) -> int:
    config, state = _config(args)
    decode = _decoder(args, config) if args.text else None
    tracer = Tracer(config, lines=args.plot is None, decode=decode, state=state)
    if args.plot is not None:
        a, b = _range(args.plot, "--plot")
        mix = step_mix(tracer, a, b)
        if args.svg:
            Path(args.svg).write_text(svg_chart(mix, a), encoding="utf-8")
        if args.json:
            print(orjson.dumps({"start": a, "steps": [dict(m) for m in mix]}).decode())
        else:
            print(terminal_chart(mix, a))
        return 0
    if args.examples is not None:
        got = tracer.example_range(*_range(args.examples, "--examples"))
    else:
        got = tracer.step(_step(args, config, state))
    print(orjson.dumps(got.to_dict(), option=orjson.OPT_INDENT_2).decode() if args.json
          else describe(got))
    return 0


def _config(args: argparse.Namespace) -> tuple[ReadConfig, dict[str, Any] | None]:
    state = load_state(Path(args.input))
    if state is None:
        return load_read_config(args.input), None
    given: dict[str, Any] = {k: v for k in ("global_batch_size", "micro_batch_size",
                                            "world_size", "seq_len")
                             if (v := getattr(args, k)) is not None}
    for item in args.set:
        key, eq, value = item.partition("=")
        try:
            given[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            eq = ""
        if not eq or not key:
            raise ConfigError(f"--set takes KEY=JSON (e.g. seed=3, shuffle='\"block\"'), "
                              f"got {item!r}")
    if args.cache:
        given["cache"] = args.cache
    if args.blend:
        given["blend"] = _blend_sources(args.blend)
    return ReadConfig.from_state(state, **given), state


def _blend_sources(items: list[str]) -> dict[str, Any]:
    """The blend's sources (the state holds its mix and its sources' fingerprints)."""
    pairs = dict(i.split("=", 1) for i in items if "=" in i)
    if len(pairs) != len(items):
        raise ConfigError(f"--blend takes NAME=DIR pairs, got {items}")
    return {"sources": pairs}


def load_state(path: Path) -> dict[str, Any] | None:
    """The loader state ``path`` holds, or ``None`` when it is a read config."""
    if path.is_dir():
        path = path / STATE_FILE
        if not path.is_file():
            raise StateError(f"{path.parent}: no {STATE_FILE} in this directory; pass the "
                             "state file itself, or a read config")
    if path.suffix in (".pt", ".pth", ".bin", ".ckpt"):
        return _state_in(_torch_load(path), path)
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); pass a read config or a state "
                          "saved as JSON") from None
    return data if _is_state(data) else None


def _torch_load(path: Path) -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(f"{path}: reading a torch checkpoint needs torch: pip install "
                          "'shardwise[torch]', or save the loader state as JSON") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds; the message names the cause
        raise StateError(f"{path}: torch could not load it safely ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); save the loader's "
                         "state_dict() as JSON and trace that") from None


def _is_state(d: Any) -> bool:
    return isinstance(d, dict) and {"kind", "fingerprint", "consumed"} <= set(d)


def _state_in(obj: Any, path: Path) -> dict[str, Any]:
    """The first shardwise state inside a checkpoint's nested dicts and lists."""
    found = _find_state(obj, 0)
    if found is None:
        raise StateError(f"{path}: holds no shardwise state (a dict with kind, fingerprint, "
                         "consumed); save the loader's state_dict() in it")
    return found


def _find_state(obj: Any, depth: int) -> dict[str, Any] | None:
    if _is_state(obj):
        return dict(obj)
    if depth > 6:
        return None
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list | tuple) \
        else ()
    for v in items:
        hit = _find_state(v, depth + 1)
        if hit is not None:
            return hit
    return None


def _step(args: argparse.Namespace, config: ReadConfig, state: dict[str, Any] | None) -> int:
    if args.step is not None:
        return int(args.step)
    if state is None:
        raise ConfigError("give --step N (or --examples A:B, or --plot A:B)")
    steps = int(state["consumed"]) // config.global_batch_size
    if steps == 0:
        raise ConfigError("the state was saved before the first step: give --step N")
    return steps - 1


def _range(text: str, flag: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"{flag} takes A:B (two integers), got {text!r}") from None
    if not 0 <= a < b:
        raise ConfigError(f"{flag} {text}: need 0 <= A < B")
    return a, b


def _decoder(args: argparse.Namespace, config: ReadConfig) -> Any:
    """ids → text with the tokenizer given, refused unless it is the cache's."""
    import xxhash

    from shardwise.storage.opening import open_cache
    from shardwise.writer.processors import load_tokenizer, parse_tokenizer

    path = args.tokenizer or config.tokenizer
    if path is None:
        raise ConfigError("--text needs the cache's tokenizer: pass --tokenizer "
                          "tokenizer.json (or put \"tokenizer\" in the read config)")
    tok = parse_tokenizer(load_tokenizer(path).json)
    fp = xxhash.xxh3_128_hexdigest(tok.to_str().encode())
    for cache in config.sources().values():
        m = open_cache(cache, verify=False).manifest
        if m is not None and m.tokenizer.fingerprint != fp:
            raise ConfigError(f"{path}: tokenizer fingerprint {fp}, but {cache} was built "
                              f"with {m.tokenizer.fingerprint}; pass the tokenizer.json the "
                              "cache was built with")
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def describe(got: StepTrace) -> str:
    """The human listing: one header per example, one line per piece."""
    c = got.config
    head = (f"step {got.step}" if got.step is not None else "examples") + (
        f": {len(got.examples)} examples of seq_len {c['seq_len']} (global batch "
        f"{c['global_batch_size']} = micro-batch {c['micro_batch_size']} × world "
        f"{c['world_size']} × accumulation "
        f"{c['global_batch_size'] // (c['micro_batch_size'] * c['world_size'])})")
    lines = [head]
    for e in got.examples:
        src = f" {e.source}#{e.source_position}" if e.source is not None else ""
        lines.append(f"rank {e.rank} micro-batch {e.micro_batch} row {e.row}: example "
                     f"{e.position}{src}" + ("" if e.status == "data" else f" ({e.status})"))
        for p in e.pieces:
            lines.append(f"  [{p.at:>5}, {p.at + p.tokens:>5})  doc {p.document} "
                         f"+{p.doc_offset}  {p.where.label()}"
                         + (f"  ({p.where.note})" if p.where.note else ""))
            if p.text is not None:
                lines.append(textwrap.indent(p.text, "      | "))
    return "\n".join(lines)
