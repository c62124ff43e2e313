"""Helpers for tests and benchmarks that drive dlu-prime without Ray (importing this package
imports no Ray)."""
