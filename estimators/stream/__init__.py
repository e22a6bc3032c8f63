"""Estimates over time: a refresh's batches, drift tests, longitudinal budgets
(docs/windows.md)."""
