"""Benchmarks run by ``ldpstream bench <name>``."""
