"""Benchmark reports: steady-state epoch time apart from compile, ratios from one run."""
