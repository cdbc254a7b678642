"""Golden values: a change of order must be a visible, deliberate act.

If an intended change alters these values, bump ``PERMUTATION_VERSION`` and regenerate:
``SHARDWISE_REGEN_GOLDEN=1 python -m pytest tests/plan/test_plan_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.plan import PERMUTATION_VERSION, BlockShuffle, Permutation

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plan_permutation_v1.json"


def current() -> dict[str, Any]:
    bs = {"n": 1000, "seed": 1234, "epoch": 2, "block_size": 16, "blocks_per_group": 4}
    return {
        "permutation_version": PERMUTATION_VERSION,
        "permutation_n1000_seed1234_epoch0_first64":
            Permutation(1000, seed=1234, epoch=0)(np.arange(64)).tolist(),
        "permutation_n1e9_seed7_epoch3_first32":
            Permutation(10**9, seed=7, epoch=3)(np.arange(32)).tolist(),
        "block_shuffle_config": bs,
        "block_shuffle_first64": BlockShuffle(**bs)(np.arange(64)).tolist(),
    }


def test_matches_golden_file() -> None:
    if os.environ.get("SHARDWISE_REGEN_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in current().items()]
        GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    assert json.loads(GOLDEN.read_text()) == current()


def reference_permutation(n: int, seed: int, epoch: int, i: int) -> int:
    """The algorithm as the permutation module docstring states it, in plain Python."""
    import hashlib

    m64 = 2**64 - 1

    def mix64(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m64
        return x ^ (x >> 31)

    text = f"shardwise.permutation.v1:seed={seed}:epoch={epoch}:tag="
    digest = hashlib.sha512(text.encode()).digest()
    keys = [int.from_bytes(digest[8 * r: 8 * r + 8], "little") for r in range(6)]
    h = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << h) - 1
    x = i
    while True:
        left, right = x >> h, x & mask
        for k in keys:
            left, right = right, left ^ (mix64(right ^ k) & mask)
        x = (left << h) | right
        if x < n:
            return x


def test_documented_algorithm_reproduces_the_golden_values() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert [reference_permutation(1000, 1234, 0, i) for i in range(64)] == \
        golden["permutation_n1000_seed1234_epoch0_first64"]
    assert [reference_permutation(10**9, 7, 3, i) for i in range(32)] == \
        golden["permutation_n1e9_seed7_epoch3_first32"]
