"""Benchmarks: `python -m bench NAME` runs one (see docs/benchmarks.md)."""
