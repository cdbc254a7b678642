"""Readers built from readers: Blend (weighted mixtures) and PackedSFT (packing records)."""
