"""Global placement over token caches: TokenDataset (map-style packed windows) and the
assembly of examples from chunk memory maps."""
