"""The benchmark harness behind ``shardwise bench``: every figure a ratio against a baseline
measured in the same run."""
