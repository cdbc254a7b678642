"""Per-rank datasets: what a rank reads, given a cache, a config, a seed and a World."""
