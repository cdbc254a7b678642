"""Adapters to training frameworks, behind optional extras and lazy imports."""
