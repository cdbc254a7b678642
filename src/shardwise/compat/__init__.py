"""The seed systems' own classes (one module per origin), thin over shardwise's readers."""
