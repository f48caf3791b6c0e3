"""Benchmarks, run as modules: ``python -m benchmarks.bench_schedule``."""
