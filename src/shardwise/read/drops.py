"""What a reader leaves out by design, said where a user looks.

Some loss is part of a layout: the tail of a token stream that does not fill a last
window, a stream block's tail, the ``total % world size`` examples a contiguous split
cannot share out evenly, the remainder of a cyclic sampler's epoch. None of it may be
silent (contract 7): every reader that drops data has ``drops()``, a list of
:class:`Drop`, shown in its ``repr``, in the torch loader's ``describe()`` and by
``shardwise inspect --seq-len``::

    >>> str(Drop(37, "tokens", "the last partial window (drop_last=True)", of=10_000))
    '37 tokens (0.37% of 10,000): the last partial window (drop_last=True)'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Drop:
    """``count`` of ``unit`` (tokens, examples, records) left out, and why; ``of``: the
    total of that unit, when known, for a share."""

    count: int
    unit: str
    reason: str
    of: int | None = None

    def __str__(self) -> str:
        share = f" ({100 * self.count / self.of:.2g}% of {self.of:,})" if self.of else ""
        return f"{self.count:,} {self.unit}{share}: {self.reason}"

    def to_dict(self) -> dict[str, object]:
        return {"count": self.count, "unit": self.unit, "reason": self.reason, "of": self.of}


def describe_drops(drops: list[Drop]) -> str:
    """``"dropped nothing"`` or the drops joined, for a one-line repr."""
    return "dropped nothing" if not drops else "dropped " + "; ".join(map(str, drops))
