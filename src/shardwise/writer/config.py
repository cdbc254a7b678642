"""Build options: small frozen dataclasses, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.errors import ConfigError

DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class ChunkPolicy:
    """When a chunk is cut: after ``max_docs`` documents or ``max_bytes`` of token data,
    whichever comes first, once it holds a token. ``segment_bytes`` overrides the
    automatic split of large JSONL files (see :mod:`shardwise.sources.discovery`)."""

    max_docs: int | None = None
    max_bytes: int | None = DEFAULT_CHUNK_BYTES
    segment_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_docs is None and self.max_bytes is None:
            raise ConfigError("a chunk needs a limit: set chunk_docs or chunk_mb")
        for name in ("max_docs", "max_bytes", "segment_bytes"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"{name} must be positive, got {v}")

    @classmethod
    def from_options(cls, *, chunk_docs: int | None = None, chunk_mb: float | None = None,
                     segment_bytes: int | None = None) -> ChunkPolicy:
        if chunk_docs is not None and chunk_mb is not None:
            raise ConfigError("give chunk_docs or chunk_mb, not both")
        if chunk_docs is not None:
            return cls(max_docs=chunk_docs, max_bytes=None, segment_bytes=segment_bytes)
        max_bytes = DEFAULT_CHUNK_BYTES if chunk_mb is None else int(chunk_mb * (1 << 20))
        return cls(max_docs=None, max_bytes=max_bytes, segment_bytes=segment_bytes)

    def full(self, docs: int, nbytes: int) -> bool:
        """Whether to cut the chunk now. Never before its first token: a run of empty
        documents joins the next chunk with a token, because Megatron-Core cannot map an
        empty ``.bin`` (only a segment of nothing but empty documents makes one)."""
        return nbytes > 0 and ((self.max_docs is not None and docs >= self.max_docs)
                               or (self.max_bytes is not None and nbytes >= self.max_bytes))
