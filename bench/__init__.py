"""Benchmarks: Ferryman side by side with its peers (not pass/fail tests)."""
