"""Benchmarks behind `python -m toolkit bench`, written against the batched engine's public API."""
