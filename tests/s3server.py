"""The tests' S3 server: SeaweedFS, started by :mod:`shardwise.bench.seaweed` (shared with
the benches that build into a bucket)."""

from shardwise.bench.seaweed import (
    FAKE_ENV,
    S3Server,
    free_ports,
    moto_s3,
    s3_environment,
    seaweed_s3,
)

__all__ = ["FAKE_ENV", "S3Server", "free_ports", "moto_s3", "s3_environment", "seaweed_s3"]
