"""Benchmarks: `python -m bench NAME [ARGS]`."""
