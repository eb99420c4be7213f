"""Benchmarks, each runnable as `python -m ops.bench.<name>` and printing one JSON object."""
